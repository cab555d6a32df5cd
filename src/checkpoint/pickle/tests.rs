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

/// A pickle and the kind of its refusal.
type Case = (&'static [u8], fn(String) -> PickleError);

/// The refusal's kind and one-line message.
fn refusal(bytes: &[u8]) -> (PickleError, String) {
    let failure = unpickle(bytes).unwrap_err();
    (failure.error.clone(), failure.to_string())
}

/// True when the refusal is of `kind`.
fn is(got: &(PickleError, String), kind: fn(String) -> PickleError) -> bool {
    std::mem::discriminant(&got.0) == std::mem::discriminant(&kind(String::new()))
}

#[test]
fn globals_outside_the_allowlist_are_refused_by_name() {
    let mut p = vec![0x80, 2];
    p.extend(global_op("posix", "system"));
    p.extend(unicode("touch /tmp/x"));
    p.extend(b"\x85R.");
    let e = refusal(&p);
    assert_eq!(e.0, PickleError::RefusedGlobal("posix.system".into()));
    assert!(e.1.contains("refuses pickle global posix.system"), "{e:?}");
    let mut p = vec![0x80, 4];
    p.extend([0x8c, 8]);
    p.extend(b"builtins");
    p.extend([0x8c, 4]);
    p.extend(b"eval");
    p.extend([0x93, b'.']);
    let e = refusal(&p);
    assert_eq!(e.0, PickleError::RefusedGlobal("builtins.eval".into()));
    let e = refusal(&global_op("torch", "load"));
    assert_eq!(e.0, PickleError::RefusedGlobal("torch.load".into()));
}

#[test]
fn truncation_and_lying_lengths_are_refused() {
    let bytes = one_tensor("w", 6);
    for cut in [0, 1, 5, 40, bytes.len() - 1] {
        let e = refusal(&bytes[..cut]);
        assert!(is(&e, PickleError::EndsEarly), "{cut}: {e:?}");
    }
    let mut p = vec![0x80, 2, b'X'];
    p.extend(u32::MAX.to_le_bytes());
    p.extend(b"abc.");
    let e = refusal(&p);
    assert!(is(&e, PickleError::EndsEarly), "{e:?}");
    assert!(e.1.starts_with("pickle opcode at byte 2: "), "{e:?}");
    let mut p = vec![0x80, 2, 0x8d];
    p.extend(u64::MAX.to_le_bytes());
    assert!(unpickle(&p).is_err());
}

#[test]
fn stack_and_memo_misuse_is_refused() {
    use PickleError::{Malformed, TooLarge, Unsupported};
    let cases: [Case; 12] = [
        (b"\x80\x02.", Malformed),    // empty stack
        (b"(.", Malformed),           // empty stack
        (b"h\x05.", Malformed),       // never stored
        (b"K\x01K\x02a.", Malformed), // not a list
        (b"K\x01K\x02s.", Malformed), // empty stack
        (b"}(K\x01u.", Malformed),    // odd number
        (b"u.", Malformed),           // no MARK
        (b"\x80\x06.", Unsupported),  // protocol 6
        (b"I01\n.", Unsupported),     // (INT)
        (b"\x81.", Unsupported),      // NEWOBJ
        // too large
        (
            b"K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.",
            TooLarge,
        ),
        (b"K\x01K\x02\x93.", Malformed), // STACK_GLOBAL needs two strings
    ];
    for (bytes, kind) in cases {
        let e = refusal(bytes);
        assert!(is(&e, kind), "{bytes:?}: {e:?}");
    }
}

#[test]
fn integers_and_floats_decode_like_python() {
    let p = unpickle(
        b"(K\xffM\x01\x02J\xfe\xff\xff\xff\x8a\x02\x00\x80\x8a\x00G?\xf8\x00\x00\x00\x00\x00\x00t.",
    )
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
    use PickleError::{Malformed, Unsupported};
    // A persistent id that is not a storage tuple.
    let e = refusal(b"K\x01Q.");
    assert!(is(&e, Malformed), "{e:?}");
    // A negative size.
    let mut p = vec![0x80, 2];
    p.extend(global_op("torch._utils", "_rebuild_tensor"));
    p.extend(b"((");
    p.extend(unicode("storage"));
    p.extend(global_op("torch", "HalfStorage"));
    p.extend(unicode("k"));
    p.extend(unicode("cpu"));
    p.extend(b"K\x04tQK\x00J\xff\xff\xff\xff\x85K\x01\x85tR.");
    let e = refusal(&p);
    assert!(is(&e, Malformed), "{e:?}");
    // A rebuild called with the wrong number of arguments.
    let mut p = global_op("torch._utils", "_rebuild_tensor_v2");
    p.extend(b")R.");
    let e = refusal(&p);
    assert!(is(&e, Unsupported), "{e:?}");
    // Calling a storage class.
    let mut p = global_op("torch", "FloatStorage");
    p.extend(b")R.");
    let e = refusal(&p);
    assert!(is(&e, Unsupported), "{e:?}");
}
