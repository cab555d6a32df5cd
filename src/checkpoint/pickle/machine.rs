//! The unpickling machine: a stack, a mark stack and a memo, run one opcode at a time
//! (see [`super::op`]), building plain values into the tables of a [`Pickle`].
//!
//! `Machine::step` (in [`dispatch`]) hands each opcode to the method of its family
//! (control, scalars, memo, sequences, dicts, objects); an opcode no family handles is
//! refused.

use std::collections::HashMap;
use std::rc::Rc;

use super::op;
use super::{
    global, Global, Pickle, PickleError, PickleFailure, StorageRef, TensorView, Value, MAX_RANK,
};
use PickleError::{EndsEarly, Malformed, TooLarge, Unsupported};

mod dispatch;

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

/// The key/value pairs of a DICT or SETITEMS, from the values above its mark.
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
