//! A restricted unpickler for PyTorch state dicts: it interprets the pickle opcodes that
//! `torch.save` emits (protocols 2 to 5) into plain data, and executes nothing.
//!
//! Only these globals are accepted, each as inert data interpreted here, never imported or
//! called: `collections.OrderedDict` (an empty dict), `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_tensor` and `torch._utils._rebuild_parameter` (a tensor view of a
//! storage) and the typed storage classes `torch.FloatStorage`, `torch.HalfStorage`, ...
//! (the element type of a storage). Any other global is refused with its name, before
//! anything else happens. Storages are persistent ids (`BINPERSID`) of the form
//! `("storage", torch.XStorage, key, location, numel)` and are read by the caller.
//!
//! Why not a crate: `serde-pickle` has no persistent ids (every torch tensor is one);
//! `repugnant-pickle` 0.0.1 ("best-effort scraping", unmaintained) keeps any global as a
//! value instead of refusing it and bounds nothing; candle-core's `pickle` module does the
//! same job but comes with the whole candle tensor library. This module is small and
//! every bound is visible.
//!
//! Bounds: every length is checked against the bytes present; containers, strings and
//! tensors live in flat tables (values refer to them by index), so memo references
//! (`BINGET`) copy nothing, deep nesting and cycles cannot overflow the stack (no
//! recursion, here or on drop), and memory stays proportional to the number of opcodes.
//!
//! Parts: the value tables here, the opcodes by name in [`op`], the machine that runs
//! them in [`machine`], tests in `tests.rs`.

use std::rc::Rc;

mod machine;
mod op;

pub(crate) use machine::unpickle;

/// Element type of a torch storage, from its class name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StorageDtype {
    /// `torch.FloatStorage`.
    F32,
    /// `torch.HalfStorage`.
    F16,
    /// `torch.BFloat16Storage`.
    BF16,
    /// `torch.DoubleStorage`.
    F64,
    /// `torch.LongStorage`.
    I64,
    /// `torch.IntStorage`.
    I32,
    /// `torch.ShortStorage`.
    I16,
    /// `torch.CharStorage`.
    I8,
    /// `torch.ByteStorage`.
    U8,
    /// `torch.BoolStorage`.
    Bool,
}

impl StorageDtype {
    fn from_class(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => StorageDtype::F32,
            "HalfStorage" => StorageDtype::F16,
            "BFloat16Storage" => StorageDtype::BF16,
            "DoubleStorage" => StorageDtype::F64,
            "LongStorage" => StorageDtype::I64,
            "IntStorage" => StorageDtype::I32,
            "ShortStorage" => StorageDtype::I16,
            "CharStorage" => StorageDtype::I8,
            "ByteStorage" => StorageDtype::U8,
            "BoolStorage" => StorageDtype::Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            StorageDtype::F64 | StorageDtype::I64 => 8,
            StorageDtype::F32 | StorageDtype::I32 => 4,
            StorageDtype::F16 | StorageDtype::BF16 | StorageDtype::I16 => 2,
            StorageDtype::I8 | StorageDtype::U8 | StorageDtype::Bool => 1,
        }
    }

    /// torch's name of the type.
    pub(crate) fn name(self) -> &'static str {
        match self {
            StorageDtype::F32 => "float32",
            StorageDtype::F16 => "float16",
            StorageDtype::BF16 => "bfloat16",
            StorageDtype::F64 => "float64",
            StorageDtype::I64 => "int64",
            StorageDtype::I32 => "int32",
            StorageDtype::I16 => "int16",
            StorageDtype::I8 => "int8",
            StorageDtype::U8 => "uint8",
            StorageDtype::Bool => "bool",
        }
    }
}

/// The globals a state dict needs; nothing else is ever accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Global {
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_tensor` (older files).
    RebuildTensor,
    /// `torch._utils._rebuild_parameter`.
    RebuildParameter,
    /// `torch.XStorage`: a storage's element type.
    StorageType(StorageDtype),
}

fn global(module: &str, name: &str) -> Result<Global, PickleError> {
    match (module, name) {
        ("collections", "OrderedDict") => Ok(Global::OrderedDict),
        ("torch._utils", "_rebuild_tensor_v2") => Ok(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor") => Ok(Global::RebuildTensor),
        ("torch._utils", "_rebuild_parameter") => Ok(Global::RebuildParameter),
        ("torch", class) => StorageDtype::from_class(class)
            .map(Global::StorageType)
            .ok_or_else(|| refused(module, name)),
        _ => Err(refused(module, name)),
    }
}

fn refused(module: &str, name: &str) -> PickleError {
    let shown: String = format!("{module}.{name}")
        .chars()
        .take(120)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    PickleError::RefusedGlobal(shown)
}

/// Why a pickle cannot be read as a state dict, by what it means for the file; each
/// variant's `Display` is the one-line reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PickleError {
    /// A global outside the allowlist (its `module.name`, control characters shown as
    /// `?`, at most 120 characters): the file asks for code to be run, and is refused.
    #[error("refuses pickle global {0} (only the tensors of a state_dict are read; nothing in the file is run)")]
    RefusedGlobal(String),
    /// The bytes end before the pickle does: a truncated file.
    #[error("{0}")]
    EndsEarly(String),
    /// A well-formed pickle using what no state dict does (a protocol past 5, an opcode,
    /// a call, backward hooks, legacy storage views).
    #[error("{0}")]
    Unsupported(String),
    /// Opcodes that contradict each other (an empty stack, a missing memo entry or mark,
    /// a value of the wrong kind): a damaged or forged pickle.
    #[error("{0}")]
    Malformed(String),
    /// A length, rank, integer or memo past this reader's bounds.
    #[error("{0}")]
    TooLarge(String),
}

/// A [`PickleError`] with the byte offset of the opcode that met it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pickle opcode at byte {at}: {error}")]
pub(crate) struct PickleFailure {
    /// Offset of the opcode in the pickle's bytes.
    pub at: usize,
    /// What is wrong.
    pub error: PickleError,
}

/// A pickled value. Containers, storages and tensors are indices into the tables of
/// [`Pickle`], so a value is small and cloning one copies no data.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer that fits i64.
    Int(i64),
    /// A float (kept for messages; a state_dict needs none).
    #[allow(dead_code)]
    Float(f64),
    /// A str.
    Str(Rc<str>),
    /// A bytes object (its content is never needed).
    Bytes,
    /// A tuple (index into the sequences).
    Tuple(usize),
    /// A list (index into the sequences).
    List(usize),
    /// A dict or OrderedDict (index into the dicts), entries in insertion order.
    Dict(usize),
    /// One of the accepted globals.
    Global(Global),
    /// A persistent storage reference (index into [`Pickle::storages`]).
    Storage(usize),
    /// A tensor view (index into [`Pickle::tensors`]).
    Tensor(usize),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Global(_) => "global",
            Value::Storage(_) => "storage",
            Value::Tensor(_) => "tensor",
        }
    }
}

/// A storage named by a persistent id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StorageRef {
    /// Element type.
    pub dtype: StorageDtype,
    /// The key: the zip member `data/KEY`, or the legacy format's storage key.
    pub key: Rc<str>,
    /// Number of elements.
    pub numel: u64,
}

/// A tensor: a strided view of a storage (all in elements).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorView {
    /// Index into [`Pickle::storages`].
    pub storage: usize,
    /// First element.
    pub offset: usize,
    /// Sizes.
    pub shape: Vec<usize>,
    /// Strides.
    pub stride: Vec<usize>,
}

/// Largest tensor rank accepted (as for `.npy`).
pub(crate) const MAX_RANK: usize = 64;

/// An unpickled object with the tables its values point into.
#[derive(Debug)]
pub(crate) struct Pickle {
    /// The object (what `STOP` returned).
    pub root: Value,
    /// Offset just past the `STOP` opcode.
    pub end: usize,
    sequences: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
    /// Storages, one per persistent id met (the same key may appear more than once).
    pub storages: Vec<StorageRef>,
    /// Tensor views.
    pub tensors: Vec<TensorView>,
}

impl Pickle {
    /// The entries of a dict value, in insertion order.
    pub(crate) fn dict(&self, value: &Value) -> Option<&[(Value, Value)]> {
        match value {
            Value::Dict(i) => Some(&self.dicts[*i]),
            _ => None,
        }
    }

    /// The items of a tuple or list value.
    pub(crate) fn items(&self, value: &Value) -> Option<&[Value]> {
        match value {
            Value::Tuple(i) | Value::List(i) => Some(&self.sequences[*i]),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
