//! One opcode at a time: [`Machine::step`] and the methods of each opcode family.

use super::{global, op, pairs, Machine, PickleError, Value};
use PickleError::{Malformed, TooLarge, Unsupported};

impl Machine<'_> {
    /// Runs one opcode; true at `STOP`. Each family of opcodes has its own method, which
    /// answers false for an opcode that is not of its family.
    pub(super) fn step(&mut self, code: u8) -> Result<bool, PickleError> {
        if code == op::STOP {
            return Ok(true);
        }
        if let Some(v) = self.scalar_op(code)? {
            self.push(v);
            return Ok(false);
        }
        let handled = self.control_op(code)?
            || self.memo_op(code)?
            || self.sequence_op(code)?
            || self.dict_op(code)?
            || self.object_op(code)?;
        if handled {
            Ok(false)
        } else {
            Err(unsupported_opcode(code))
        }
    }

    /// The framing and stack-shape opcodes (PROTO, FRAME, MARK, POP, POP_MARK, DUP).
    fn control_op(&mut self, code: u8) -> Result<bool, PickleError> {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that push one plain value read from the bytes (None, bools, ints,
    /// floats, strings, bytes): that value, or None for an opcode of another family.
    fn scalar_op(&mut self, code: u8) -> Result<Option<Value>, PickleError> {
        let v = match code {
            op::NONE => Value::None,
            op::NEWTRUE => Value::Bool(true),
            op::NEWFALSE => Value::Bool(false),
            op::BININT1 => Value::Int(i64::from(self.u8()?)),
            op::BININT2 => {
                let b = self.take(2)?;
                Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]])))
            }
            op::BININT => Value::Int(i64::from(self.u32()? as i32)),
            op::LONG1 => {
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                self.int(b)?
            }
            op::LONG4 => {
                let n = self.u32()? as usize;
                let b = self.take(n)?;
                self.int(b)?
            }
            op::BINFLOAT => {
                let b = self.take(8)?;
                Value::Float(f64::from_be_bytes(b.try_into().expect("8 bytes")))
            }
            op::BINUNICODE => {
                let n = self.u32()? as usize;
                self.string(n)?
            }
            op::SHORT_BINUNICODE => {
                let n = usize::from(self.u8()?);
                self.string(n)?
            }
            op::BINUNICODE8 => {
                let n = self.len64()?;
                self.string(n)?
            }
            op::SHORT_BINBYTES => {
                let n = usize::from(self.u8()?);
                self.bytes_value(n)?
            }
            op::BINBYTES => {
                let n = self.u32()? as usize;
                self.bytes_value(n)?
            }
            op::BINBYTES8 => {
                let n = self.len64()?;
                self.bytes_value(n)?
            }
            _ => return Ok(None),
        };
        Ok(Some(v))
    }

    /// The memo opcodes: BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET.
    fn memo_op(&mut self, code: u8) -> Result<bool, PickleError> {
        match code {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The tuple and list opcodes: the builders (EMPTY_TUPLE, TUPLE1 to TUPLE3, TUPLE,
    /// EMPTY_LIST, LIST) and APPEND, APPENDS.
    fn sequence_op(&mut self, code: u8) -> Result<bool, PickleError> {
        match code {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The dict opcodes: EMPTY_DICT, DICT, SETITEM, SETITEMS.
    fn dict_op(&mut self, code: u8) -> Result<bool, PickleError> {
        match code {
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
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that name or make objects: GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
    /// BINPERSID.
    fn object_op(&mut self, code: u8) -> Result<bool, PickleError> {
        match code {
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
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The refusal of an opcode that no family handles, named where [`op::name`] knows it.
fn unsupported_opcode(code: u8) -> PickleError {
    Unsupported(format!(
        "opcode {} is not supported",
        op::name(code).map_or_else(
            || format!("0x{code:02x}"),
            |name| format!("0x{code:02x} ({name})"),
        )
    ))
}
