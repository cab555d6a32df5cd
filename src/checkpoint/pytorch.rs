//! PyTorch checkpoints (`.pt`, `.pth`, `.bin` from `torch.save`) read without Python.
//!
//! Two containers are read: the zip archive `torch.save` writes since torch 1.6
//! (`NAME/data.pkl` plus one member `NAME/data/KEY` per storage) and the legacy stream of
//! `torch.save(..., _use_new_zipfile_serialization=False)` (magic number, protocol and
//! system-info pickles, the object pickle, the list of storage keys, then each storage as
//! an 8-byte element count and its bytes). The object pickle goes through the restricted
//! unpickler of `super::pickle`, which executes nothing and refuses every global a
//! state_dict does not need, naming it.
//!
//! Which dict is the state_dict: the top-level dict when it holds a tensor (then every
//! value must be a tensor); otherwise the first of `state_dict`, `model`, `module` that is
//! a dict of tensors (as Lightning, timm's training script and many others save). Names
//! are kept as they are (a prefix such as Lightning's `model.` is not stripped).
//!
//! Tensors are materialized from their storages (any offset and strides, views sharing a
//! storage included) after every size is checked against the storage's bytes: f32, f16
//! and bf16 become f32, f64 stays f64, int64 stays int64 and the smaller integer and bool
//! types become int32 (integer tensors such as `num_batches_tracked` are kept so that
//! `--allow-unused` can skip them; the import refuses them as weights, by name).
//!
//! Longer than ~500 lines: the two container formats (zip and legacy) share the storage
//! and view checks that make a hostile file fail before any large read; splitting them
//! would put those checks and their callers in different files.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek};
use std::path::Path;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

use super::pickle::{unpickle, Pickle, StorageDtype, StorageRef, TensorView, Value};
use crate::archive::ZipArchive;
use crate::error::{one_line, Error, Result};
use crate::tensor::{NamedTensor, TensorValue};

/// First bytes of a legacy (non-zip) torch file: the pickled magic number
/// 0x1950a86a20f9469cfc6c at protocol 2.
pub const LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e";

/// Largest `data.pkl` accepted (a state_dict's pickle is about 100 bytes per tensor).
const MAX_PICKLE: u64 = 1 << 28;
/// Tensors may repeat storage elements (views sharing one storage, stride 0) up to this
/// many times the elements of all storages together.
const MAX_VIEW_FACTOR: u64 = 4;
/// Names allowed for the nested state_dict, in order of preference.
const NESTED_KEYS: [&str; 3] = ["state_dict", "model", "module"];

fn bad(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::BadTensor(format!("{what}: {reason}"))
}

/// The record folder of a torch zip archive (`NAME` of `NAME/data.pkl`), if the archive
/// has one; `None` for other zips (such as `.npz`).
pub fn torch_record<R: Read + Seek>(archive: &ZipArchive<R>) -> Option<String> {
    archive.entries().iter().find_map(|e| {
        let dir = e.name.strip_suffix("/data.pkl")?;
        (!dir.is_empty() && !dir.contains('/')).then(|| dir.to_string())
    })
}

/// True if `bytes` starts like a legacy (non-zip) torch file.
pub fn is_legacy(bytes: &[u8]) -> bool {
    bytes.starts_with(LEGACY_MAGIC)
}

/// Reads the tensors of a torch file (zip or legacy) as stored, without choosing a
/// layout: what `build --weights` sees before the import checks names and shapes.
pub fn read_file(path: &Path) -> Result<Vec<NamedTensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    read_bytes(bytes, &path.display().to_string())
}

/// [`read_file`] for a file held in memory; `what` names it in errors.
pub fn read_bytes(bytes: Vec<u8>, what: &str) -> Result<Vec<NamedTensor>> {
    if is_legacy(&bytes) {
        return read_legacy(&bytes, what);
    }
    let len = bytes.len() as u64;
    let mut archive = ZipArchive::new(std::io::Cursor::new(bytes), len).map_err(|e| {
        bad(
            what,
            format!(
                "not a PyTorch zip archive or legacy PyTorch file (as zip: {})",
                one_line(e)
            ),
        )
    })?;
    read_torch_zip(&mut archive, what)
}

/// Reads a torch zip archive; `what` names it in errors. Every storage member's declared
/// size is checked against what the pickle's tensors need before any storage is read.
pub fn read_torch_zip<R: Read + Seek>(
    archive: &mut ZipArchive<R>,
    what: &str,
) -> Result<Vec<NamedTensor>> {
    let record = torch_record(archive).ok_or_else(|| bad(what, "no data.pkl in the archive"))?;
    let records = archive
        .entries()
        .iter()
        .filter(|e| e.name.ends_with("/data.pkl"))
        .count();
    if records > 1 {
        return Err(bad(what, "the archive holds more than one data.pkl"));
    }
    if let Some(order) = read_member(archive, &format!("{record}/byteorder"), 16, what)? {
        if order != b"little" {
            return Err(bad(
                what,
                format!(
                    "byte order '{}' is not supported (little-endian only)",
                    String::from_utf8_lossy(&order)
                ),
            ));
        }
    }
    let pickle_name = format!("{record}/data.pkl");
    let pickle_bytes = read_member(archive, &pickle_name, MAX_PICKLE, what)?
        .ok_or_else(|| bad(what, "no data.pkl in the archive"))?;
    let pickle = unpickle(&pickle_bytes).map_err(|e| bad(what, format!("{pickle_name}: {e}")))?;
    // Every declared size first: nothing is inflated for a member that lies about its size.
    let mut members = Vec::new();
    for (storage, need) in declared_storages(&pickle, what)? {
        let key: &str = &storage.key;
        let name = format!("{record}/data/{key}");
        let index = archive
            .index_of(&name)
            .ok_or_else(|| bad(what, format!("storage '{key}' has no member {name}")))?;
        let have = archive.entries()[index].size;
        if have != need as u64 {
            return Err(bad(what, storage_mismatch(storage, have, need)));
        }
        members.push((key.to_string(), index, need));
    }
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    for (key, index, need) in members {
        let bytes = archive
            .read(index, need as u64)
            .map_err(|e| bad(what, one_line(e)))?;
        storages.insert(key, bytes);
    }
    tensors_of(&pickle, &storages, what)
}

/// Reads a legacy (non-zip) torch file held in `bytes`.
pub fn read_legacy(bytes: &[u8], what: &str) -> Result<Vec<NamedTensor>> {
    if !is_legacy(bytes) {
        return Err(bad(what, "not a torch file (no magic number)"));
    }
    let mut pos = LEGACY_MAGIC.len();
    let mut next = |part: &str| -> Result<Pickle> {
        let p = unpickle(&bytes[pos..]).map_err(|e| bad(what, format!("{part}: {e}")))?;
        pos += p.end;
        Ok(p)
    };
    let version = next("protocol version")?;
    if !matches!(version.root, Value::Int(1001)) {
        return Err(bad(
            what,
            "unknown legacy protocol version (re-save with a current torch)",
        ));
    }
    let info = next("system info")?;
    let little = info.dict(&info.root).is_some_and(|entries| {
        entries
            .iter()
            .any(|(k, v)| matches!((k, v), (Value::Str(k), Value::Bool(true)) if &**k == "little_endian"))
    });
    if !little {
        return Err(bad(what, "not a little-endian torch file"));
    }
    let pickle = next("object pickle")?;
    let keys = next("storage keys")?;
    let keys = storage_keys(&keys, what)?;
    let storages = legacy_storages(bytes, &mut pos, &pickle, keys, what)?;
    if pos != bytes.len() {
        return Err(bad(
            what,
            format!("{} bytes after the last storage", bytes.len() - pos),
        ));
    }
    tensors_of(&pickle, &storages, what)
}

/// The storage keys of a legacy file, from the pickle `keys` (a list of strings).
fn storage_keys(keys: &Pickle, what: &str) -> Result<Vec<String>> {
    keys.items(&keys.root)
        .filter(|_| matches!(keys.root, Value::List(_)))
        .ok_or_else(|| bad(what, "the storage key list is not a list"))?
        .iter()
        .map(|k| match k {
            Value::Str(s) => Ok(s.to_string()),
            other => Err(bad(what, format!("a storage key is a {other:?}"))),
        })
        .collect()
}

/// The storages of a legacy file, one per key of `keys` in order from `pos` in `bytes`
/// (which it advances past them): each an 8-byte element count, checked against what the
/// tensors of `pickle` say, and its bytes.
fn legacy_storages(
    bytes: &[u8],
    pos: &mut usize,
    pickle: &Pickle,
    keys: Vec<String>,
    what: &str,
) -> Result<HashMap<String, Vec<u8>>> {
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    for key in keys {
        let reference = pickle
            .storages
            .iter()
            .find(|s| *s.key == *key)
            .ok_or_else(|| bad(what, format!("storage '{key}' is not used by any tensor")))?;
        let count = bytes
            .get(*pos..*pos + 8)
            .ok_or_else(|| bad(what, format!("storage '{key}' is missing (truncated file)")))?;
        let count = u64::from_le_bytes(count.try_into().expect("8 bytes"));
        if count != reference.numel {
            return Err(bad(
                what,
                format!(
                    "storage '{key}' holds {count} elements, its tensors say {}",
                    reference.numel
                ),
            ));
        }
        *pos += 8;
        let size = storage_bytes(reference, what)?;
        let data = bytes
            .get(*pos..)
            .and_then(|rest| rest.get(..size))
            .ok_or_else(|| {
                bad(
                    what,
                    format!("storage '{key}' needs {size} bytes, the file ends first"),
                )
            })?;
        *pos += size;
        if storages.insert(key.clone(), data.to_vec()).is_some() {
            return Err(bad(what, format!("storage '{key}' appears twice")));
        }
    }
    Ok(storages)
}

/// Reads the member `name` whole (None if absent), refusing one that declares more than
/// `limit` bytes before reading it.
fn read_member<R: Read + Seek>(
    archive: &mut ZipArchive<R>,
    name: &str,
    limit: u64,
    what: &str,
) -> Result<Option<Vec<u8>>> {
    let Some(index) = archive.index_of(name) else {
        return Ok(None);
    };
    archive
        .read(index, limit)
        .map(Some)
        .map_err(|e| bad(what, one_line(e)))
}

/// The storages the pickle's tensors use, once per key, with the bytes each needs;
/// refuses a key declared with two types or sizes.
fn declared_storages<'p>(pickle: &'p Pickle, what: &str) -> Result<Vec<(&'p StorageRef, usize)>> {
    let mut seen: HashMap<&str, &StorageRef> = HashMap::new();
    let mut out = Vec::new();
    for s in &pickle.storages {
        match seen.get(&*s.key) {
            Some(first) if first.dtype != s.dtype || first.numel != s.numel => {
                return Err(bad(
                    what,
                    format!("storage '{}' is declared with two types or sizes", s.key),
                ));
            }
            Some(_) => continue,
            None => {}
        }
        out.push((s, storage_bytes(s, what)?));
        seen.insert(&s.key, s);
    }
    Ok(out)
}

fn storage_mismatch(s: &StorageRef, have: u64, need: usize) -> String {
    format!(
        "storage '{}' holds {have} bytes, {} {} elements need {need}",
        s.key,
        s.numel,
        s.dtype.name()
    )
}

fn storage_bytes(storage: &StorageRef, what: &str) -> Result<usize> {
    storage
        .numel
        .checked_mul(storage.dtype.size() as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            bad(
                what,
                format!(
                    "storage '{}' of {} elements is too large",
                    storage.key, storage.numel
                ),
            )
        })
}

/// The (name, tensor index) pairs of the state_dict inside the pickle.
fn state_dict(pickle: &Pickle, what: &str) -> Result<Vec<(String, usize)>> {
    let top = pickle.dict(&pickle.root).ok_or_else(|| {
        bad(
            what,
            "the file holds no dict of tensors (a whole pickled model is not read: save model.state_dict())",
        )
    })?;
    let tensors_of_dict =
        |entries: &[(Value, Value)], place: &str| -> Result<Vec<(String, usize)>> {
            entries
                .iter()
                .map(|(k, v)| {
                    let Value::Str(k) = k else {
                        return Err(bad(what, format!("{place}has a key that is not a string")));
                    };
                    match v {
                        Value::Tensor(t) => Ok((k.to_string(), *t)),
                        _ => Err(bad(what, format!("{place}entry '{k}' is not a tensor"))),
                    }
                })
                .collect()
        };
    if top.iter().any(|(_, v)| matches!(v, Value::Tensor(_))) {
        return tensors_of_dict(top, "");
    }
    for name in NESTED_KEYS {
        let nested = top
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(k) if &**k == name))
            .and_then(|(_, v)| pickle.dict(v));
        if let Some(entries) = nested {
            if entries.iter().any(|(_, v)| matches!(v, Value::Tensor(_))) {
                return tensors_of_dict(entries, &format!("'{name}' "));
            }
        }
    }
    let keys: Vec<String> = top
        .iter()
        .take(8)
        .map(|(k, _)| match k {
            Value::Str(s) => format!("'{s}'"),
            other => format!("{other:?}"),
        })
        .collect();
    Err(bad(
        what,
        format!(
            "no tensor at the top level and no nested state_dict/model/module dict of tensors (top-level keys: {})",
            if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
        ),
    ))
}

fn tensors_of(
    pickle: &Pickle,
    storages: &HashMap<String, Vec<u8>>,
    what: &str,
) -> Result<Vec<NamedTensor>> {
    // Every reference to a key must agree on type and size, and match the bytes present.
    let mut budget: u64 = 0;
    for (s, need) in declared_storages(pickle, what)? {
        let have = storages.get(&*s.key).map_or(0, Vec::len);
        if have != need {
            return Err(bad(what, storage_mismatch(s, have as u64, need)));
        }
        budget = budget.saturating_add(s.numel);
    }
    let mut budget = budget
        .saturating_mul(MAX_VIEW_FACTOR)
        .saturating_add(1 << 16);
    let mut out: BTreeMap<String, TensorValue> = BTreeMap::new();
    let mut order = Vec::new();
    for (name, t) in state_dict(pickle, what)? {
        let view = &pickle.tensors[t];
        let storage = &pickle.storages[view.storage];
        let values = materialize(view, storage, &storages[&*storage.key], &mut budget)
            .map_err(|e| bad(what, format!("tensor '{name}': {e}")))?;
        if out.insert(name.clone(), values).is_some() {
            return Err(bad(what, format!("tensor '{name}' appears twice")));
        }
        order.push(name);
    }
    if order.is_empty() {
        return Err(bad(what, "the state_dict holds no tensor"));
    }
    Ok(order
        .into_iter()
        .map(|name| {
            let value = out.remove(&name).expect("inserted above");
            NamedTensor { name, value }
        })
        .collect())
}

/// Why a tensor view cannot be read from its storage.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum ViewError {
    /// The product of the sizes does not fit a `usize`.
    #[error("size {0:?} overflows")]
    SizeOverflows(Vec<usize>),
    /// Some element of the view lies outside its storage.
    #[error("size {shape:?}, stride {stride:?} and offset {offset} reach past its storage of {storage_numel} elements")]
    PastStorage {
        /// The view's sizes.
        shape: Vec<usize>,
        /// The view's strides.
        stride: Vec<usize>,
        /// The view's first element.
        offset: usize,
        /// The storage's element count.
        storage_numel: u64,
    },
    /// Views together would materialize more than [`MAX_VIEW_FACTOR`] times the
    /// storages' elements (a small file expanding into a huge one).
    #[error("the tensors repeat their storages' elements more than {MAX_VIEW_FACTOR} times over")]
    OverBudget,
}

/// The storage element indices of a view, in row-major order, after checking that the
/// view lies inside the storage; `budget` (elements left to materialize) is charged.
fn element_indices(
    view: &TensorView,
    storage_numel: u64,
    budget: &mut u64,
) -> std::result::Result<Vec<usize>, ViewError> {
    let count = view
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ViewError::SizeOverflows(view.shape.clone()))?;
    if count == 0 {
        return Ok(Vec::new());
    }
    // The last element any index can reach (sizes are at least 1 here).
    let last = view
        .shape
        .iter()
        .zip(&view.stride)
        .try_fold(view.offset, |a, (&d, &s)| {
            a.checked_add((d - 1).checked_mul(s)?)
        });
    if last.is_none_or(|last| (last as u64) >= storage_numel) {
        return Err(ViewError::PastStorage {
            shape: view.shape.clone(),
            stride: view.stride.clone(),
            offset: view.offset,
            storage_numel,
        });
    }
    if count as u64 > *budget {
        return Err(ViewError::OverBudget);
    }
    *budget -= count as u64;
    let mut indices = Vec::with_capacity(count);
    let rank = view.shape.len();
    let mut at = vec![0usize; rank];
    let mut flat = view.offset;
    for _ in 0..count {
        indices.push(flat);
        // Advance the odometer. Every index pushed lies within the bound checked above;
        // only the step past an axis's end may wrap, and it is undone right away.
        for axis in (0..rank).rev() {
            at[axis] += 1;
            flat = flat.wrapping_add(view.stride[axis]);
            if at[axis] < view.shape[axis] {
                break;
            }
            flat = flat.wrapping_sub(view.stride[axis].wrapping_mul(view.shape[axis]));
            at[axis] = 0;
        }
    }
    Ok(indices)
}

fn materialize(
    view: &TensorView,
    storage: &StorageRef,
    bytes: &[u8],
    budget: &mut u64,
) -> std::result::Result<TensorValue, ViewError> {
    let indices = element_indices(view, storage.numel, budget)?;
    let shape = IxDyn(&view.shape);
    fn gather<T, const N: usize>(
        bytes: &[u8],
        indices: &[usize],
        shape: IxDyn,
        from: impl Fn([u8; N]) -> T,
    ) -> ArrayD<T> {
        let values = indices
            .iter()
            .map(|&i| from(bytes[i * N..i * N + N].try_into().expect("N bytes")))
            .collect();
        ArrayD::from_shape_vec(shape, values)
            .expect("element_indices gives one index per element of the shape")
    }
    Ok(match storage.dtype {
        StorageDtype::F32 => TensorValue::F32(gather(bytes, &indices, shape, f32::from_le_bytes)),
        StorageDtype::F16 => TensorValue::F32(gather(bytes, &indices, shape, |b| {
            f16::from_le_bytes(b).to_f32()
        })),
        StorageDtype::BF16 => TensorValue::F32(gather(bytes, &indices, shape, |b| {
            bf16::from_le_bytes(b).to_f32()
        })),
        StorageDtype::F64 => TensorValue::F64(gather(bytes, &indices, shape, f64::from_le_bytes)),
        StorageDtype::I64 => TensorValue::I64(gather(bytes, &indices, shape, i64::from_le_bytes)),
        StorageDtype::I32 => TensorValue::I32(gather(bytes, &indices, shape, i32::from_le_bytes)),
        StorageDtype::I16 => TensorValue::I32(gather(bytes, &indices, shape, |b| {
            i32::from(i16::from_le_bytes(b))
        })),
        StorageDtype::I8 => TensorValue::I32(gather(bytes, &indices, shape, |b: [u8; 1]| {
            i32::from(b[0] as i8)
        })),
        StorageDtype::U8 | StorageDtype::Bool => {
            TensorValue::I32(gather(bytes, &indices, shape, |b: [u8; 1]| i32::from(b[0])))
        }
    })
}

#[cfg(test)]
mod tests;
