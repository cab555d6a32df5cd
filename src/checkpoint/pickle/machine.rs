//! The unpickling machine: a stack, a mark stack and a memo, run one opcode at a time
//! (see [`super::op`]), building plain values into the tables of a [`Pickle`].
//!
//! Longer than ~500 lines because it is one dispatch: every opcode the restricted unpickler
//! accepts is handled in one `match`, so that what it does (and refuses) reads in one place.

use std::collections::HashMap;
use std::rc::Rc;

use super::op;
use super::{
    global, Global, Pickle, PickleError, PickleFailure, StorageRef, TensorView, Value, MAX_RANK,
};
use PickleError::{EndsEarly, Malformed, TooLarge, Unsupported};

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    out: Pickle,
}

/// Reads one pickle from the start of `bytes`, up to and including its `STOP`.
pub(crate) fn unpickle(bytes: &[u8]) -> Result<Pickle, PickleFailure> {
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
        let located = |error| PickleFailure { at, error };
        let code = m.take(1).map_err(located)?[0];
        if m.step(code).map_err(located)? {
            m.out.root = m.pop().map_err(located)?;
            m.out.end = m.pos;
            return Ok(m.out);
        }
    }
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let bytes: &'a [u8] = self.bytes;
        match bytes.get(
            self.pos
                ..self
                    .pos
                    .checked_add(n)
                    .ok_or_else(|| TooLarge("length overflows".into()))?,
        ) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(EndsEarly(format!(
                "the pickle ends early (needs {n} more bytes at byte {}, has {})",
                self.pos,
                bytes.len() - self.pos
            ))),
        }
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len64(&mut self) -> Result<usize, PickleError> {
        let b = self.take(8)?;
        let n = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        usize::try_from(n).map_err(|_| TooLarge(format!("length {n} is too large")))
    }

    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.bytes[self.pos..];
        let end = rest.iter().take(1024).position(|&b| b == b'\n');
        let end = end.ok_or_else(|| {
            if rest.len() < 1024 {
                EndsEarly("the pickle ends early inside a GLOBAL name".into())
            } else {
                TooLarge("a GLOBAL name longer than 1024 bytes".into())
            }
        })?;
        let text = std::str::from_utf8(&rest[..end])
            .map_err(|_| Malformed("GLOBAL name is not UTF-8".into()))?;
        self.pos += end + 1;
        Ok(text)
    }

    fn string(&mut self, n: usize) -> Result<Value, PickleError> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| Malformed("a str is not valid UTF-8".into()))?;
        Ok(Value::Str(Rc::from(s)))
    }

    fn bytes_value(&mut self, n: usize) -> Result<Value, PickleError> {
        self.take(n)?;
        Ok(Value::Bytes)
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(Malformed("pops an empty stack".into()));
        }
        Ok(self.stack.pop().expect("checked"))
    }

    fn top(&self) -> Result<&Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(Malformed("reads an empty stack".into()));
        }
        Ok(self.stack.last().expect("checked"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| Malformed("no MARK to pop to".into()))?;
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

    fn list_at_top(&self) -> Result<usize, PickleError> {
        match self.top()? {
            Value::List(i) => Ok(*i),
            other => Err(Malformed(format!(
                "APPEND to a {}, not a list",
                other.kind()
            ))),
        }
    }

    fn dict_at_top(&self) -> Result<usize, PickleError> {
        match self.top()? {
            Value::Dict(i) => Ok(*i),
            other => Err(Malformed(format!(
                "SETITEM on a {}, not a dict",
                other.kind()
            ))),
        }
    }

    fn memo_get(&mut self, index: u32) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(&index)
            .cloned()
            .ok_or_else(|| Malformed(format!("memo entry {index} was never stored")))?;
        self.push(v);
        Ok(())
    }

    fn memo_put(&mut self, index: u32) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        self.memo.insert(index, v);
        Ok(())
    }

    fn int(&mut self, bytes: &[u8]) -> Result<Value, PickleError> {
        if bytes.len() > 8 {
            return Err(TooLarge(format!(
                "an integer of {} bytes is too large",
                bytes.len()
            )));
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
    fn step(&mut self, code: u8) -> Result<bool, PickleError> {
        match code {
            op::PROTO => {
                let v = self.u8()?;
                if v > 5 {
                    return Err(Unsupported(format!(
                        "pickle protocol {v} is not supported (2 to 5)"
                    )));
                }
            }
            op::FRAME => {
                self.take(8)?; // FRAME: a length hint only
            }
            op::STOP => return Ok(true),
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                self.pop()?;
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let v = self.top()?.clone();
                self.push(v);
            }
            op::NONE => self.push(Value::None),
            op::NEWTRUE => self.push(Value::Bool(true)),
            op::NEWFALSE => self.push(Value::Bool(false)),
            op::BININT1 => {
                let v = self.u8()?;
                self.push(Value::Int(i64::from(v)));
            }
            op::BININT2 => {
                let b = self.take(2)?;
                self.push(Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]]))));
            }
            op::BININT => {
                let v = self.u32()? as i32;
                self.push(Value::Int(i64::from(v)));
            }
            op::LONG1 => {
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                let v = self.int(b)?;
                self.push(v);
            }
            op::LONG4 => {
                let n = self.u32()? as usize;
                let b = self.take(n)?;
                let v = self.int(b)?;
                self.push(v);
            }
            op::BINFLOAT => {
                let b = self.take(8)?;
                self.push(Value::Float(f64::from_be_bytes(
                    b.try_into().expect("8 bytes"),
                )));
            }
            op::BINUNICODE => {
                let n = self.u32()? as usize;
                let v = self.string(n)?;
                self.push(v);
            }
            op::SHORT_BINUNICODE => {
                let n = usize::from(self.u8()?);
                let v = self.string(n)?;
                self.push(v);
            }
            op::BINUNICODE8 => {
                let n = self.len64()?;
                let v = self.string(n)?;
                self.push(v);
            }
            op::SHORT_BINBYTES => {
                let n = usize::from(self.u8()?);
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            op::BINBYTES => {
                let n = self.u32()? as usize;
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            op::BINBYTES8 => {
                let n = self.len64()?;
                let v = self.bytes_value(n)?;
                self.push(v);
            }
            op::EMPTY_TUPLE => {
                let v = self.new_seq(Vec::new(), false);
                self.push(v);
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(code - op::TUPLE1) + 1;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err(Malformed(format!("TUPLE{n} on a stack of fewer values")));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let v = self.new_seq(items, false);
                self.push(v);
            }
            op::TUPLE => {
                let items = self.pop_mark()?;
                let v = self.new_seq(items, false);
                self.push(v);
            }
            op::EMPTY_LIST => {
                let v = self.new_seq(Vec::new(), true);
                self.push(v);
            }
            op::LIST => {
                let items = self.pop_mark()?;
                let v = self.new_seq(items, true);
                self.push(v);
            }
            op::APPEND => {
                let v = self.pop()?;
                let list = self.list_at_top()?;
                self.out.sequences[list].push(v);
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                let list = self.list_at_top()?;
                self.out.sequences[list].extend(items);
            }
            op::EMPTY_DICT => {
                let v = self.new_dict(Vec::new());
                self.push(v);
            }
            op::DICT => {
                let items = self.pop_mark()?;
                let entries = pairs(items)?;
                let v = self.new_dict(entries);
                self.push(v);
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = self.dict_at_top()?;
                self.out.dicts[dict].push((key, value));
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                let dict = self.dict_at_top()?;
                let entries = pairs(items)?;
                self.out.dicts[dict].extend(entries);
            }
            op::BINPUT => {
                let i = self.u8()?;
                self.memo_put(u32::from(i))?;
            }
            op::LONG_BINPUT => {
                let i = self.u32()?;
                self.memo_put(i)?;
            }
            op::MEMOIZE => {
                let i =
                    u32::try_from(self.memo.len()).map_err(|_| TooLarge("memo is full".into()))?;
                self.memo_put(i)?;
            }
            op::BINGET => {
                let i = self.u8()?;
                self.memo_get(u32::from(i))?;
            }
            op::LONG_BINGET => {
                let i = self.u32()?;
                self.memo_get(i)?;
            }
            op::GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(Value::Global(global(module, name)?));
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Value::Str(module), Value::Str(name)) = (&module, &name) else {
                    return Err(Malformed("STACK_GLOBAL needs two strings".into()));
                };
                self.push(Value::Global(global(module, name)?));
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.reduce(callable, args)?;
                self.push(v);
            }
            op::BUILD => {
                let _state = self.pop()?;
                // An OrderedDict's instance attributes (state_dict's `_metadata`) are
                // not needed; state for anything else would need a class we refuse.
                self.dict_at_top()
                    .map_err(|_| Unsupported("BUILD is only accepted on a dict".into()))?;
            }
            op::BINPERSID => {
                let pid = self.pop()?;
                let v = self.persistent(pid)?;
                self.push(v);
            }
            other => {
                return Err(Unsupported(format!(
                    "opcode {} is not supported",
                    op::name(other).map_or_else(
                        || format!("0x{other:02x}"),
                        |name| format!("0x{other:02x} ({name})"),
                    )
                )))
            }
        }
        Ok(false)
    }

    fn reduce(&mut self, callable: Value, args: Value) -> Result<Value, PickleError> {
        let Value::Global(g) = callable else {
            return Err(Malformed(format!("REDUCE calls a {}", callable.kind())));
        };
        let args: Vec<Value> = self
            .out
            .items(&args)
            .filter(|_| matches!(args, Value::Tuple(_)))
            .ok_or_else(|| Malformed("REDUCE without an argument tuple".into()))?
            .to_vec();
        match g {
            Global::OrderedDict if args.is_empty() => Ok(self.new_dict(Vec::new())),
            Global::RebuildTensorV2 if (6..=7).contains(&args.len()) => {
                if !self.out.dict(&args[5]).is_some_and(|d| d.is_empty()) {
                    return Err(Unsupported("a tensor with backward hooks".into()));
                }
                self.tensor(&args[..4])
            }
            Global::RebuildTensor if args.len() == 4 => self.tensor(&args),
            Global::RebuildParameter if (3..=4).contains(&args.len()) => match args[0] {
                Value::Tensor(i) => Ok(Value::Tensor(i)),
                _ => Err(Malformed(
                    "_rebuild_parameter of something other than a tensor".into(),
                )),
            },
            other => Err(Unsupported(format!(
                "calls {other:?} with {} arguments, which a state_dict never does",
                args.len()
            ))),
        }
    }

    fn tensor(&mut self, args: &[Value]) -> Result<Value, PickleError> {
        let Value::Storage(storage) = args[0] else {
            return Err(Malformed(format!(
                "a tensor of a {}, not a storage",
                args[0].kind()
            )));
        };
        let offset = index(&args[1], "storage offset")?;
        let dims = |v: &Value, what: &str| -> Result<Vec<usize>, PickleError> {
            let items = self.out.items(v).ok_or_else(|| {
                Malformed(format!("tensor {what} is a {}, not a tuple", v.kind()))
            })?;
            if items.len() > MAX_RANK {
                return Err(TooLarge(format!(
                    "tensor rank {} is too large",
                    items.len()
                )));
            }
            items.iter().map(|d| index(d, what)).collect()
        };
        let shape = dims(&args[2], "size")?;
        let stride = dims(&args[3], "stride")?;
        if shape.len() != stride.len() {
            return Err(Malformed(format!(
                "tensor size {shape:?} and stride {stride:?} differ in rank"
            )));
        }
        self.out.tensors.push(TensorView {
            storage,
            offset,
            shape,
            stride,
        });
        Ok(Value::Tensor(self.out.tensors.len() - 1))
    }

    fn persistent(&mut self, pid: Value) -> Result<Value, PickleError> {
        let items = match &pid {
            Value::Tuple(i) => self.out.sequences[*i].clone(),
            other => return Err(Malformed(format!("persistent id is a {}", other.kind()))),
        };
        let ok = match items.as_slice() {
            [Value::Str(tag), Value::Global(Global::StorageType(dtype)), Value::Str(key), Value::Str(_location), Value::Int(numel), rest @ ..]
                if &**tag == "storage" =>
            {
                match rest {
                    [] | [Value::None] => Some((*dtype, key.clone(), *numel)),
                    [_] => {
                        return Err(Unsupported(
                            "storage views of legacy torch files are not supported (re-save with a current torch)"
                                .into(),
                        ))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let (dtype, key, numel) = ok.ok_or_else(|| {
            Malformed(
                "persistent id is not ('storage', torch.XStorage, key, location, numel)".into(),
            )
        })?;
        let numel =
            u64::try_from(numel).map_err(|_| Malformed(format!("storage of {numel} elements")))?;
        self.out.storages.push(StorageRef { dtype, key, numel });
        Ok(Value::Storage(self.out.storages.len() - 1))
    }
}

fn index(v: &Value, what: &str) -> Result<usize, PickleError> {
    match v {
        Value::Int(n) => {
            usize::try_from(*n).map_err(|_| Malformed(format!("tensor {what} {n} is negative")))
        }
        other => Err(Malformed(format!(
            "tensor {what} is a {}, not an int",
            other.kind()
        ))),
    }
}

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>, PickleError> {
    if !items.len().is_multiple_of(2) {
        return Err(Malformed("a dict from an odd number of values".into()));
    }
    let mut it = items.into_iter();
    let mut out = Vec::with_capacity(it.len() / 2);
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}
