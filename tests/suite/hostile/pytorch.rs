//! Hostile and broken PyTorch checkpoints given to `build --weights`: pickles that would run
//! code (made by torch.save / Python's pickle, fixtures/pytorch/), and files built here
//! that lie about sizes, are truncated, nest deeply or reach outside their storages. Each
//! is refused with exit 2 and one line, leaves nothing in the working folder, and runs
//! nothing (the os.system payload would create `pwned_by_pickle` in the working folder).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{assert_refusal, file, listing, s};

/// What the os.system payload in the fixtures would create in the working folder.
const MARKER: &str = "pwned_by_pickle";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join("pytorch")
        .join(name)
}

/// Runs `build --weights WEIGHTS -o out.onnx` with `dir` as the working folder and asserts
/// a refusal naming `needle` that leaves `dir` as it was (so no marker file either).
fn refuse_in(dir: &Path, weights: &Path, needle: &str) {
    let before = listing(dir);
    let o = Command::new(env!("CARGO_BIN_EXE_gmlp-onnx"))
        .current_dir(dir)
        .args(["build", "--weights", s(weights), "-o", "out.onnx"])
        .output()
        .expect("run gmlp-onnx");
    assert_refusal(&o, 2, needle, &weights.display().to_string());
    assert_eq!(
        listing(dir),
        before,
        "{} left files behind",
        weights.display()
    );
    assert!(!dir.join(MARKER).exists());
}

#[test]
fn pickles_that_would_run_code_are_refused_naming_the_global() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The payload is live: Python's own unpickler runs the command (then fails on torch,
    // which the test environment does not have).
    let scratch = tempfile::tempdir().unwrap();
    let script = "import pickle, sys, zipfile\n\
        z = zipfile.ZipFile(sys.argv[1])\n\
        try:\n    pickle.loads(z.read('hostile_os_system/data.pkl'))\n\
        except Exception:\n    pass\n";
    let py = std::env::var("GMLP_ONNX_PYTHON").unwrap_or_else(|_| "python3".into());
    let o = Command::new(py)
        .current_dir(scratch.path())
        .args(["-c", script, s(&fixture("hostile_os_system.pt"))])
        .output()
        .expect("run python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        scratch.path().join(MARKER).exists(),
        "the hostile fixture should run its command under Python's pickle"
    );

    let global = "refuses pickle global";
    refuse_in(
        d,
        &fixture("hostile_os_system.pt"),
        &format!("{global} posix.system"),
    );
    refuse_in(
        d,
        &fixture("hostile_os_system.legacy.pt"),
        &format!("{global} posix.system"),
    );
    refuse_in(
        d,
        &fixture("hostile_eval.pt"),
        &format!("{global} __builtin__.eval"),
    );
    // torch.save(model) pickles the module class itself.
    refuse_in(
        d,
        &fixture("whole_model.pt"),
        &format!("{global} timm.models.mlp_mixer.MlpMixer"),
    );
    refuse_in(
        d,
        &fixture("no_state_dict.pt"),
        "no tensor at the top level and no nested state_dict/model/module dict of tensors (top-level keys: 'epoch', 'weights')",
    );
}

/// Pickle integer (LONG1, 8 bytes).
fn long(v: u64) -> Vec<u8> {
    let mut out = vec![0x8a, 8];
    out.extend(v.to_le_bytes());
    out
}

fn unicode(text: &str) -> Vec<u8> {
    let mut out = vec![b'X'];
    out.extend((text.len() as u32).to_le_bytes());
    out.extend(text.as_bytes());
    out
}

/// `{"w": tensor}` as torch.save pickles it: storage "0" of `numel` elements of `class`,
/// viewed with `offset`, `shape`, `stride`.
fn state_dict_pickle(
    class: &str,
    numel: u64,
    offset: u64,
    shape: &[u64],
    stride: &[u64],
) -> Vec<u8> {
    let mut p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(".to_vec();
    p.extend(unicode("w"));
    p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    p.extend(unicode("storage"));
    p.extend(format!("ctorch\n{class}\n").as_bytes());
    p.extend(unicode("0"));
    p.extend(unicode("cpu"));
    p.extend(long(numel));
    p.extend(b"tQ");
    p.extend(long(offset));
    p.push(b'(');
    for &d in shape {
        p.extend(long(d));
    }
    p.extend(b"t(");
    for &d in stride {
        p.extend(long(d));
    }
    p.extend(b"t\x89h\x00)RtRu.");
    p
}

/// A torch-style zip archive (stored members under `archive/`).
fn torch_zip(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        zip.start_file(format!("archive/{name}"), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn pt(dir: &Path, name: &str, pickle: &[u8], storage: &[u8]) -> PathBuf {
    file(
        dir,
        name,
        &torch_zip(&[
            ("data.pkl", pickle),
            ("data/0", storage),
            ("byteorder", b"little"),
        ]),
    )
}

#[test]
fn files_that_lie_or_break_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let inputs = tempfile::tempdir().unwrap();
    let (d, i) = (work.path(), inputs.path());
    let six = [0u8; 24];
    // The builder is right: this one reads (and then fails recognition, as a lone "w").
    let fine = pt(
        i,
        "fine.pt",
        &state_dict_pickle("FloatStorage", 6, 0, &[2, 3], &[3, 1]),
        &six,
    );
    refuse_in(
        d,
        &fine,
        "cannot tell which implementation wrote this checkpoint",
    );

    let whole = std::fs::read(fixture("views.pt")).unwrap();
    let cut = file(i, "cut.pt", &whole[..whole.len() / 2]);
    refuse_in(d, &cut, "not a readable zip archive");
    let legacy = std::fs::read(fixture("dtypes.legacy.pt")).unwrap();
    let cut = file(i, "cut.legacy.pt", &legacy[..legacy.len() - 3]);
    refuse_in(d, &cut, "the file ends first");
    let cut = file(i, "cut_pickle.legacy.pt", &legacy[..200]);
    refuse_in(d, &cut, "object pickle: pickle opcode at byte");

    let sd = state_dict_pickle("FloatStorage", 6, 0, &[6], &[1]);
    let cut = pt(i, "cut_pickle.pt", &sd[..sd.len() - 10], &six);
    refuse_in(d, &cut, "the pickle ends early");
    let short = pt(i, "short.pt", &sd, &six[..8]);
    refuse_in(
        d,
        &short,
        "storage '0' holds 8 bytes, 6 float32 elements need 24",
    );
    let huge = pt(
        i,
        "huge.pt",
        &state_dict_pickle("FloatStorage", 1 << 62, 0, &[6], &[1]),
        &six,
    );
    refuse_in(
        d,
        &huge,
        "storage '0' of 4611686018427387904 elements is too large",
    );
    let large = pt(
        i,
        "large.pt",
        &state_dict_pickle("DoubleStorage", 1 << 40, 0, &[6], &[1]),
        &six,
    );
    refuse_in(
        d,
        &large,
        "holds 24 bytes, 1099511627776 float64 elements need",
    );
    let past = pt(
        i,
        "past.pt",
        &state_dict_pickle("FloatStorage", 6, 2, &[2, 3], &[3, 1]),
        &six,
    );
    refuse_in(
        d,
        &past,
        "tensor 'w': size [2, 3], stride [3, 1] and offset 2 reach past its storage of 6 elements",
    );
    let wrapping = pt(
        i,
        "wrapping.pt",
        &state_dict_pickle("FloatStorage", 6, 0, &[2, 3], &[u64::MAX / 2, 1]),
        &six,
    );
    refuse_in(d, &wrapping, "reach past its storage");
    let expanded = pt(
        i,
        "expanded.pt",
        &state_dict_pickle("FloatStorage", 6, 0, &[1 << 40], &[0]),
        &six,
    );
    refuse_in(
        d,
        &expanded,
        "repeat their storages' elements more than 4 times over",
    );
    let unknown = pt(
        i,
        "complex.pt",
        &state_dict_pickle("ComplexFloatStorage", 3, 0, &[3], &[1]),
        &six,
    );
    refuse_in(
        d,
        &unknown,
        "refuses pickle global torch.ComplexFloatStorage",
    );
    let big_endian = file(
        i,
        "big.pt",
        &torch_zip(&[("data.pkl", &sd), ("data/0", &six), ("byteorder", b"big")]),
    );
    refuse_in(d, &big_endian, "byte order 'big' is not supported");
    let missing = file(i, "missing.pt", &torch_zip(&[("data.pkl", &sd)]));
    refuse_in(d, &missing, "storage '0' has no member archive/data/0");

    // A million nested lists: no recursion, refused quickly as not a dict of tensors.
    let n = 1_000_000;
    let mut deep = vec![b'('; n];
    deep.extend(vec![b'l'; n]);
    deep.push(b'.');
    let deep = pt(i, "deep.pt", &deep, &six);
    refuse_in(d, &deep, "the file holds no dict of tensors");
    // A memo reference fetched a million times copies nothing.
    let mut wide = b"]q\x00h\x00a(".to_vec();
    for _ in 0..n {
        wide.extend(b"h\x00");
    }
    wide.extend(b"l.");
    let wide = pt(i, "wide.pt", &wide, &six);
    refuse_in(d, &wide, "the file holds no dict of tensors");
}
