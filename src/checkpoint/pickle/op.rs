//! The pickle opcodes, named as CPython's `Lib/pickletools.py` documents them (the
//! reference for the format: each opcode is one byte, followed by its inline argument,
//! acting on a stack, a mark stack and a memo). Protocol 2 (PEP 307) added `PROTO`,
//! `NEWOBJ`, `EXT*`, `TUPLE1..3`, `NEWTRUE`/`NEWFALSE` and `LONG1`/`LONG4`; protocol 3
//! `BINBYTES`/`SHORT_BINBYTES`; protocol 4 (PEP 3154) `FRAME`, `MEMOIZE`,
//! `STACK_GLOBAL`, `SHORT_BINUNICODE`, `BINUNICODE8`, `BINBYTES8`, `EMPTY_SET`,
//! `ADDITEMS`, `FROZENSET` and `NEWOBJ_EX`; protocol 5 (PEP 574) `BYTEARRAY8`,
//! `NEXT_BUFFER` and `READONLY_BUFFER`. `torch.save` writes protocol 2 by default.
//!
//! Every opcode is listed, the ones the unpickler refuses too, so that a refusal names it.

macro_rules! opcodes {
    ($($name:ident = $byte:literal, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[allow(dead_code)] // refused opcodes are only named in messages
            pub(crate) const $name: u8 = $byte;
        )*
        /// The pickletools name of an opcode byte.
        pub(crate) fn name(op: u8) -> Option<&'static str> {
            match op {
                $($byte => Some(stringify!($name)),)*
                _ => None,
            }
        }
    };
}

opcodes! {
    // Framing and control.
    PROTO = 0x80, "Protocol version (1-byte argument); protocol 2+.";
    FRAME = 0x95, "A frame's length (8-byte argument), a read-ahead hint; protocol 4+.";
    STOP = b'.', "End of the pickle: the top of the stack is the result.";
    MARK = b'(', "Pushes a mark on the mark stack.";
    POP = b'0', "Discards the top of the stack.";
    POP_MARK = b'1', "Discards the stack down to the last mark.";
    DUP = b'2', "Pushes the top of the stack again.";
    // Constants and numbers.
    NONE = b'N', "Pushes None.";
    NEWTRUE = 0x88, "Pushes True; protocol 2+.";
    NEWFALSE = 0x89, "Pushes False; protocol 2+.";
    BININT1 = b'K', "Pushes a 1-byte unsigned integer.";
    BININT2 = b'M', "Pushes a 2-byte little-endian unsigned integer.";
    BININT = b'J', "Pushes a 4-byte little-endian signed integer.";
    LONG1 = 0x8a, "Pushes a little-endian two's-complement integer of a 1-byte length; protocol 2+.";
    LONG4 = 0x8b, "Pushes a little-endian two's-complement integer of a 4-byte length; protocol 2+.";
    BINFLOAT = b'G', "Pushes an 8-byte big-endian IEEE double.";
    INT = b'I', "Pushes an integer written as text (protocol 0).";
    LONG = b'L', "Pushes a long written as text (protocol 0).";
    FLOAT = b'F', "Pushes a float written as text (protocol 0).";
    // Strings and bytes.
    BINUNICODE = b'X', "Pushes a UTF-8 str of a 4-byte length.";
    SHORT_BINUNICODE = 0x8c, "Pushes a UTF-8 str of a 1-byte length; protocol 4+.";
    BINUNICODE8 = 0x8d, "Pushes a UTF-8 str of an 8-byte length; protocol 4+.";
    SHORT_BINBYTES = b'C', "Pushes bytes of a 1-byte length; protocol 3+.";
    BINBYTES = b'B', "Pushes bytes of a 4-byte length; protocol 3+.";
    BINBYTES8 = 0x8e, "Pushes bytes of an 8-byte length; protocol 4+.";
    BYTEARRAY8 = 0x96, "Pushes a bytearray of an 8-byte length; protocol 5.";
    STRING = b'S', "Pushes a quoted Python 2 str (protocol 0).";
    BINSTRING = b'T', "Pushes a Python 2 str of a 4-byte length (protocol 1).";
    SHORT_BINSTRING = b'U', "Pushes a Python 2 str of a 1-byte length (protocol 1).";
    UNICODE = b'V', "Pushes a raw-unicode-escaped str (protocol 0).";
    NEXT_BUFFER = 0x97, "Pushes the next out-of-band buffer; protocol 5.";
    READONLY_BUFFER = 0x98, "Makes the top buffer read-only; protocol 5.";
    // Containers.
    EMPTY_TUPLE = b')', "Pushes ().";
    TUPLE1 = 0x85, "Replaces the top value with a 1-tuple of it; protocol 2+.";
    TUPLE2 = 0x86, "Replaces the top two values with a 2-tuple; protocol 2+.";
    TUPLE3 = 0x87, "Replaces the top three values with a 3-tuple; protocol 2+.";
    TUPLE = b't', "Replaces the values down to the last mark with a tuple of them.";
    EMPTY_LIST = b']', "Pushes [].";
    LIST = b'l', "Replaces the values down to the last mark with a list of them.";
    APPEND = b'a', "Appends the top value to the list below it.";
    APPENDS = b'e', "Extends the list below the last mark with the values above it.";
    EMPTY_DICT = b'}', "Pushes {}.";
    DICT = b'd', "Replaces the key, value pairs down to the last mark with a dict.";
    SETITEM = b's', "Sets key to value (the top two) in the dict below them.";
    SETITEMS = b'u', "Sets the key, value pairs above the last mark in the dict below it.";
    EMPTY_SET = 0x8f, "Pushes an empty set; protocol 4+.";
    ADDITEMS = 0x90, "Adds the values above the last mark to the set below it; protocol 4+.";
    FROZENSET = 0x91, "Replaces the values down to the last mark with a frozenset; protocol 4+.";
    // The memo.
    BINPUT = b'q', "Stores the top value in the memo under a 1-byte index.";
    LONG_BINPUT = b'r', "Stores the top value in the memo under a 4-byte index.";
    MEMOIZE = 0x94, "Stores the top value in the memo under the next index; protocol 4+.";
    BINGET = b'h', "Pushes the memo value of a 1-byte index.";
    LONG_BINGET = b'j', "Pushes the memo value of a 4-byte index.";
    PUT = b'p', "Stores in the memo under a text index (protocol 0).";
    GET = b'g', "Pushes the memo value of a text index (protocol 0).";
    // Objects: what can run code, so only allowed globals are ever interpreted.
    GLOBAL = b'c', "Pushes module.name, both as newline-terminated text.";
    STACK_GLOBAL = 0x93, "Pushes module.name from the top two strs; protocol 4+.";
    REDUCE = b'R', "Calls the callable below the top with the argument tuple on top.";
    BUILD = b'b', "Sets the state (the top value) of the object below it.";
    BINPERSID = b'Q', "Pushes the object of a persistent id (the top value).";
    PERSID = b'P', "Pushes the object of a text persistent id (protocol 0).";
    INST = b'i', "Builds a class instance from text names (protocol 0).";
    OBJ = b'o', "Builds a class instance from the values above the mark (protocol 1).";
    NEWOBJ = 0x81, "cls.__new__(cls, *args); protocol 2+.";
    NEWOBJ_EX = 0x92, "cls.__new__(cls, *args, **kwargs); protocol 4+.";
    EXT1 = 0x82, "Pushes an object of the copyreg extension registry (1-byte code); protocol 2+.";
    EXT2 = 0x83, "Pushes an object of the copyreg extension registry (2-byte code); protocol 2+.";
    EXT4 = 0x84, "Pushes an object of the copyreg extension registry (4-byte code); protocol 2+.";
}
