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

use std::collections::HashMap;
use std::rc::Rc;

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

fn global(module: &str, name: &str) -> Result<Global, String> {
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

fn refused(module: &str, name: &str) -> String {
    let shown: String = format!("{module}.{name}")
        .chars()
        .take(120)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    format!("refuses pickle global {shown} (only the tensors of a state_dict are read; nothing in the file is run)")
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

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    out: Pickle,
}

/// Reads one pickle from the start of `bytes`, up to and including its `STOP`.
pub(crate) fn unpickle(bytes: &[u8]) -> Result<Pickle, String> {
    let mut m = Machine {
        bytes,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        out: Pickle {
            root: Value::None,
            end: 0,
            sequences: Vec::new(),
            dicts: Vec::new(),
            storages: Vec::new(),
            tensors: Vec::new(),
        },
    };
    loop {
        let at = m.pos;
        let op = m.take(1)?[0];
        if m.step(op)
            .map_err(|e| format!("pickle opcode at byte {at}: {e}"))?
        {
            let root = m.pop()?;
            m.out.root = root;
            m.out.end = m.pos;
            return Ok(m.out);
        }
    }
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let bytes: &'a [u8] = self.bytes;
        match bytes.get(self.pos..self.pos.checked_add(n).ok_or("length overflows")?) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(format!(
                "the pickle ends early (needs {n} more bytes at byte {}, has {})",
                self.pos,
                bytes.len() - self.pos
            )),
        }
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len64(&mut self) -> Result<usize, String> {
        let b = self.take(8)?;
        let n = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        usize::try_from(n).map_err(|_| format!("length {n} is too large"))
    }

    fn line(&mut self) -> Result<&'a str, String> {
        let rest = &self.bytes[self.pos..];
        let end = rest.iter().take(1024).position(|&b| b == b'\n');
        let end = end.ok_or(if rest.len() < 1024 {
            "the pickle ends early inside a GLOBAL name"
        } else {
            "a GLOBAL name longer than 1024 bytes"
        })?;
        let text = std::str::from_utf8(&rest[..end]).map_err(|_| "GLOBAL name is not UTF-8")?;
        self.pos += end + 1;
        Ok(text)
    }

    fn string(&mut self, n: usize) -> Result<Value, String> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| "a str is not valid UTF-8".to_string())?;
        Ok(Value::Str(Rc::from(s)))
    }

    fn bytes_value(&mut self, n: usize) -> Result<Value, String> {
        self.take(n)?;
        Ok(Value::Bytes)
    }

    fn pop(&mut self) -> Result<Value, String> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err("pops an empty stack".into());
        }
        Ok(self.stack.pop().expect("checked"))
    }

    fn top(&self) -> Result<&Value, String> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err("reads an empty stack".into());
        }
        Ok(self.stack.last().expect("checked"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let mark = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(mark))
    }

    fn push(&mut self, v: Value) {
        self.stack.push(v);
    }

    fn new_seq(&mut self, items: Vec<Value>, list: bool) -> Value {
        self.out.sequences.push(items);
        let i = self.out.sequences.len() - 1;
        if list {
            Value::List(i)
        } else {
            Value::Tuple(i)
        }
    }

    fn new_dict(&mut self, entries: Vec<(Value, Value)>) -> Value {
        self.out.dicts.push(entries);
        Value::Dict(self.out.dicts.len() - 1)
    }

    fn list_at_top(&self) -> Result<usize, String> {
        match self.top()? {
            Value::List(i) => Ok(*i),
            other => Err(format!("APPEND to a {}, not a list", other.kind())),
        }
    }

    fn dict_at_top(&self) -> Result<usize, String> {
        match self.top()? {
            Value::Dict(i) => Ok(*i),
            other => Err(format!("SETITEM on a {}, not a dict", other.kind())),
        }
    }

    fn memo_get(&mut self, index: u32) -> Result<(), String> {
        let v = self
            .memo
            .get(&index)
            .cloned()
            .ok_or_else(|| format!("memo entry {index} was never stored"))?;
        self.push(v);
        Ok(())
    }

    fn memo_put(&mut self, index: u32) -> Result<(), String> {
        let v = self.top()?.clone();
        self.memo.insert(index, v);
        Ok(())
    }

    fn int(&mut self, bytes: &[u8]) -> Result<Value, String> {
        if bytes.len() > 8 {
            return Err(format!("an integer of {} bytes is too large", bytes.len()));
        }
        let mut buf = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
            [0xff; 8]
        } else {
            [0; 8]
        };
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(Value::Int(i64::from_le_bytes(buf)))
    }

    /// Runs one opcode; true at `STOP`.
    fn step(&mut self, op: u8) -> Result<bool, String> {
        match op {
            0x80 => {
                let v = self.u8()?;
                if v > 5 {
                    return Err(format!("pickle protocol {v} is not supported (2 to 5)"));
                }
            }
            0x95 => {
                self.take(8)?; // FRAME: a length hint only
            }
            b'.' => return Ok(true),
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?.clone();
                self.push(v);
            }
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'K' => {
                let v = self.u8()?;
                self.push(Value::Int(i64::from(v)));
            }
            b'M' => {
                let b = self.take(2)?;
                self.push(Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]]))));
            }
            b'J' => {
                let v = self.u32()? as i32;
                self.push(Value::Int(i64::from(v)));
            }
            0x8a => {
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                let v = self.int(b)?;
                self.push(v);
            }
            0x8b => {
                let n = self.u32()? as usize;
                let b = self.take(n)?;
                let v = self.int(b)?;
                self.push(v);
            }
            b'G' => {
                let b = self.take(8)?;
                self.push(Value::Float(f64::from_be_bytes(
                    b.try_into().expect("8 bytes"),
                )));
            }
            b'X' => {
                let n = self.u32()? as usize;
                let v = self.string(n)?;
                self.push(v);
            }
            0x8c => {
                let n = usize::from(self.u8()?);
                let v = self.string(n)?;
                self.push(v);
            }
            0x8d => {
                let n = self.len64()?;
                let v = self.string(n)?;
                self.push(v);
            }
            b'C' => {
                let n = usize::from(self.u8()?);
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            b'B' => {
                let n = self.u32()? as usize;
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            0x8e => {
                let n = self.len64()?;
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            b')' => {
                let v = self.new_seq(Vec::new(), false);
                self.push(v);
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err(format!("TUPLE{n} on a stack of fewer values"));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let v = self.new_seq(items, false);
                self.push(v);
            }
            b't' => {
                let items = self.pop_mark()?;
                let v = self.new_seq(items, false);
                self.push(v);
            }
            b']' => {
                let v = self.new_seq(Vec::new(), true);
                self.push(v);
            }
            b'l' => {
                let items = self.pop_mark()?;
                let v = self.new_seq(items, true);
                self.push(v);
            }
            b'a' => {
                let v = self.pop()?;
                let list = self.list_at_top()?;
                self.out.sequences[list].push(v);
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.list_at_top()?;
                self.out.sequences[list].extend(items);
            }
            b'}' => {
                let v = self.new_dict(Vec::new());
                self.push(v);
            }
            b'd' => {
                let items = self.pop_mark()?;
                let entries = pairs(items)?;
                let v = self.new_dict(entries);
                self.push(v);
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = self.dict_at_top()?;
                self.out.dicts[dict].push((key, value));
            }
            b'u' => {
                let items = self.pop_mark()?;
                let dict = self.dict_at_top()?;
                let entries = pairs(items)?;
                self.out.dicts[dict].extend(entries);
            }
            b'q' => {
                let i = self.u8()?;
                self.memo_put(u32::from(i))?;
            }
            b'r' => {
                let i = self.u32()?;
                self.memo_put(i)?;
            }
            0x94 => {
                let i = u32::try_from(self.memo.len()).map_err(|_| "memo is full")?;
                self.memo_put(i)?;
            }
            b'h' => {
                let i = self.u8()?;
                self.memo_get(u32::from(i))?;
            }
            b'j' => {
                let i = self.u32()?;
                self.memo_get(i)?;
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(Value::Global(global(module, name)?));
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(module), Value::Str(name)) = (&module, &name) else {
                    return Err("STACK_GLOBAL needs two strings".into());
                };
                self.push(Value::Global(global(module, name)?));
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.reduce(callable, args)?;
                self.push(v);
            }
            b'b' => {
                let _state = self.pop()?;
                // An OrderedDict's instance attributes (state_dict's `_metadata`) are
                // not needed; state for anything else would need a class we refuse.
                self.dict_at_top()
                    .map_err(|_| "BUILD is only accepted on a dict".to_string())?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let v = self.persistent(pid)?;
                self.push(v);
            }
            other => return Err(format!("opcode {} is not supported", opcode_name(other))),
        }
        Ok(false)
    }

    fn reduce(&mut self, callable: Value, args: Value) -> Result<Value, String> {
        let Value::Global(g) = callable else {
            return Err(format!("REDUCE calls a {}", callable.kind()));
        };
        let args: Vec<Value> = self
            .out
            .items(&args)
            .filter(|_| matches!(args, Value::Tuple(_)))
            .ok_or("REDUCE without an argument tuple")?
            .to_vec();
        match g {
            Global::OrderedDict if args.is_empty() => Ok(self.new_dict(Vec::new())),
            Global::RebuildTensorV2 if (6..=7).contains(&args.len()) => {
                if !self.out.dict(&args[5]).is_some_and(|d| d.is_empty()) {
                    return Err("a tensor with backward hooks".into());
                }
                self.tensor(&args[..4])
            }
            Global::RebuildTensor if args.len() == 4 => self.tensor(&args),
            Global::RebuildParameter if (3..=4).contains(&args.len()) => match args[0] {
                Value::Tensor(i) => Ok(Value::Tensor(i)),
                _ => Err("_rebuild_parameter of something other than a tensor".into()),
            },
            other => Err(format!(
                "calls {other:?} with {} arguments, which a state_dict never does",
                args.len()
            )),
        }
    }

    fn tensor(&mut self, args: &[Value]) -> Result<Value, String> {
        let Value::Storage(storage) = args[0] else {
            return Err(format!("a tensor of a {}, not a storage", args[0].kind()));
        };
        let offset = index(&args[1], "storage offset")?;
        let dims = |v: &Value, what: &str| -> Result<Vec<usize>, String> {
            let items = self
                .out
                .items(v)
                .ok_or_else(|| format!("tensor {what} is a {}, not a tuple", v.kind()))?;
            if items.len() > MAX_RANK {
                return Err(format!("tensor rank {} is too large", items.len()));
            }
            items.iter().map(|d| index(d, what)).collect()
        };
        let shape = dims(&args[2], "size")?;
        let stride = dims(&args[3], "stride")?;
        if shape.len() != stride.len() {
            return Err(format!(
                "tensor size {shape:?} and stride {stride:?} differ in rank"
            ));
        }
        self.out.tensors.push(TensorView {
            storage,
            offset,
            shape,
            stride,
        });
        Ok(Value::Tensor(self.out.tensors.len() - 1))
    }

    fn persistent(&mut self, pid: Value) -> Result<Value, String> {
        let items = match &pid {
            Value::Tuple(i) => self.out.sequences[*i].clone(),
            other => return Err(format!("persistent id is a {}", other.kind())),
        };
        let ok = match items.as_slice() {
            [Value::Str(tag), Value::Global(Global::StorageType(dtype)), Value::Str(key), Value::Str(_location), Value::Int(numel), rest @ ..]
                if &**tag == "storage" =>
            {
                match rest {
                    [] | [Value::None] => Some((*dtype, key.clone(), *numel)),
                    [_] => {
                        return Err(
                            "storage views of legacy torch files are not supported (re-save with a current torch)"
                                .into(),
                        )
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let (dtype, key, numel) =
            ok.ok_or("persistent id is not ('storage', torch.XStorage, key, location, numel)")?;
        let numel = u64::try_from(numel).map_err(|_| format!("storage of {numel} elements"))?;
        self.out.storages.push(StorageRef { dtype, key, numel });
        Ok(Value::Storage(self.out.storages.len() - 1))
    }
}

fn index(v: &Value, what: &str) -> Result<usize, String> {
    match v {
        Value::Int(n) => usize::try_from(*n).map_err(|_| format!("tensor {what} {n} is negative")),
        other => Err(format!("tensor {what} is a {}, not an int", other.kind())),
    }
}

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>, String> {
    if !items.len().is_multiple_of(2) {
        return Err("a dict from an odd number of values".into());
    }
    let mut it = items.into_iter();
    let mut out = Vec::with_capacity(it.len() / 2);
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

fn opcode_name(op: u8) -> String {
    let name = match op {
        b'c' | 0x93 => "GLOBAL",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'i' => "INST",
        b'o' => "OBJ",
        b'P' => "PERSID",
        b'I' => "INT",
        b'L' => "LONG",
        b'F' => "FLOAT",
        b'S' => "STRING",
        b'V' => "UNICODE",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'p' => "PUT",
        b'g' => "GET",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x82..=0x84 => "EXT",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    };
    format!("0x{op:02x} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `c{module}\n{name}\n`.
    fn global_op(module: &str, name: &str) -> Vec<u8> {
        format!("c{module}\n{name}\n").into_bytes()
    }

    fn unicode(s: &str) -> Vec<u8> {
        let mut out = vec![b'X'];
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
        out
    }

    /// A state dict {name: float32 tensor of `numel` elements, shape [numel]} as
    /// torch.save writes it (protocol 2).
    fn one_tensor(name: &str, numel: u8) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(global_op("collections", "OrderedDict"));
        p.extend(b"q\x00)Rq\x01(");
        p.extend(unicode(name));
        p.extend(global_op("torch._utils", "_rebuild_tensor_v2"));
        p.extend(b"((");
        p.extend(unicode("storage"));
        p.extend(global_op("torch", "FloatStorage"));
        p.extend(unicode("0"));
        p.extend(unicode("cpu"));
        p.extend([
            b'K', numel, b't', b'Q', b'K', 0, b'K', numel, 0x85, b'K', 1, 0x85,
        ]);
        p.extend(b"\x89h\x00)Rt");
        p.extend(b"Ru}b.");
        p
    }

    #[test]
    fn a_torch_style_state_dict_gives_its_tensor_view() {
        let bytes = one_tensor("w", 6);
        let p = unpickle(&bytes).unwrap();
        assert_eq!(p.end, bytes.len());
        let entries = p.dict(&p.root).unwrap();
        assert_eq!(entries.len(), 1);
        let (Value::Str(k), Value::Tensor(t)) = &entries[0] else {
            panic!("{entries:?}")
        };
        assert_eq!(&**k, "w");
        assert_eq!(
            p.tensors[*t],
            TensorView {
                storage: 0,
                offset: 0,
                shape: vec![6],
                stride: vec![1]
            }
        );
        assert_eq!(p.storages[0].dtype, StorageDtype::F32);
        assert_eq!(&*p.storages[0].key, "0");
        assert_eq!(p.storages[0].numel, 6);
    }

    #[test]
    fn globals_outside_the_allowlist_are_refused_by_name() {
        let mut p = vec![0x80, 2];
        p.extend(global_op("posix", "system"));
        p.extend(unicode("touch /tmp/x"));
        p.extend(b"\x85R.");
        let e = unpickle(&p).unwrap_err();
        assert!(e.contains("refuses pickle global posix.system"), "{e}");
        let mut p = vec![0x80, 4];
        p.extend([0x8c, 8]);
        p.extend(b"builtins");
        p.extend([0x8c, 4]);
        p.extend(b"eval");
        p.extend([0x93, b'.']);
        let e = unpickle(&p).unwrap_err();
        assert!(e.contains("refuses pickle global builtins.eval"), "{e}");
        let e = unpickle(&global_op("torch", "load")).unwrap_err();
        assert!(e.contains("torch.load"), "{e}");
    }

    #[test]
    fn truncation_and_lying_lengths_are_refused() {
        let bytes = one_tensor("w", 6);
        for cut in [0, 1, 5, 40, bytes.len() - 1] {
            let e = unpickle(&bytes[..cut]).unwrap_err();
            assert!(e.contains("ends early"), "{cut}: {e}");
        }
        let mut p = vec![0x80, 2, b'X'];
        p.extend(u32::MAX.to_le_bytes());
        p.extend(b"abc.");
        assert!(unpickle(&p).unwrap_err().contains("ends early"));
        let mut p = vec![0x80, 2, 0x8d];
        p.extend(u64::MAX.to_le_bytes());
        assert!(unpickle(&p).is_err());
    }

    #[test]
    fn stack_and_memo_misuse_is_refused() {
        assert!(unpickle(b"\x80\x02.").unwrap_err().contains("empty stack"));
        assert!(unpickle(b"(.").unwrap_err().contains("empty stack"));
        assert!(unpickle(b"h\x05.").unwrap_err().contains("never stored"));
        assert!(unpickle(b"K\x01K\x02a.")
            .unwrap_err()
            .contains("not a list"));
        assert!(unpickle(b"K\x01K\x02s.")
            .unwrap_err()
            .contains("empty stack"));
        assert!(unpickle(b"}(K\x01u.").unwrap_err().contains("odd number"));
        assert!(unpickle(b"u.").unwrap_err().contains("no MARK"));
        assert!(unpickle(b"\x80\x06.").unwrap_err().contains("protocol 6"));
        assert!(unpickle(b"I01\n.").unwrap_err().contains("(INT)"));
        assert!(unpickle(b"\x81.").unwrap_err().contains("NEWOBJ"));
        let e = unpickle(b"K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn integers_and_floats_decode_like_python() {
        let p = unpickle(b"(K\xffM\x01\x02J\xfe\xff\xff\xff\x8a\x02\x00\x80\x8a\x00G?\xf8\x00\x00\x00\x00\x00\x00t.")
            .unwrap();
        let items = p.items(&p.root).unwrap();
        let got: Vec<String> = items.iter().map(|v| format!("{v:?}")).collect();
        assert_eq!(
            got,
            [
                "Int(255)",
                "Int(513)",
                "Int(-2)",
                "Int(-32768)",
                "Int(0)",
                "Float(1.5)"
            ]
        );
    }

    #[test]
    fn deep_nesting_and_cycles_neither_recurse_nor_copy() {
        // 200k nested lists: `(` * n then `l` * n.
        let n = 200_000;
        let mut p = vec![b'('; n];
        p.extend(vec![b'l'; n]);
        p.push(b'.');
        let got = unpickle(&p).unwrap();
        assert!(matches!(got.root, Value::List(_)));
        drop(got);
        // A list appended to itself, then fetched from the memo many times.
        let mut p = b"]q\x00h\x00a".to_vec();
        p.extend(b"(".iter());
        p.extend(std::iter::repeat_n(*b"h\x00", 10_000).flatten());
        p.extend(b"l.");
        let got = unpickle(&p).unwrap();
        assert_eq!(got.items(&got.root).unwrap().len(), 10_000);
    }

    #[test]
    fn persistent_ids_and_rebuilds_are_checked() {
        // A persistent id that is not a storage tuple.
        let e = unpickle(b"K\x01Q.").unwrap_err();
        assert!(e.contains("persistent id is a int"), "{e}");
        // A negative size.
        let mut p = vec![0x80, 2];
        p.extend(global_op("torch._utils", "_rebuild_tensor"));
        p.extend(b"((");
        p.extend(unicode("storage"));
        p.extend(global_op("torch", "HalfStorage"));
        p.extend(unicode("k"));
        p.extend(unicode("cpu"));
        p.extend(b"K\x04tQK\x00J\xff\xff\xff\xff\x85K\x01\x85tR.");
        let e = unpickle(&p).unwrap_err();
        assert!(e.contains("size -1 is negative"), "{e}");
        // A rebuild called with the wrong number of arguments.
        let mut p = global_op("torch._utils", "_rebuild_tensor_v2");
        p.extend(b")R.");
        assert!(unpickle(&p).unwrap_err().contains("0 arguments"));
        // Calling a storage class.
        let mut p = global_op("torch", "FloatStorage");
        p.extend(b")R.");
        assert!(unpickle(&p).unwrap_err().contains("StorageType"));
    }
}
