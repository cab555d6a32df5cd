//! Decompression bombs: a 4 MB `.pt` whose storage member deflates to 4 GiB while its
//! tensor needs 16 bytes, and a 4 MB `.npz` whose `.npy` member does the same under a
//! 16-byte header shape. Both are valid zip archives (correct sizes and CRC-32, zip64
//! fields where a size needs them, as Python's zipfile writes them), built here at test
//! time. Each must be refused from the declared sizes, before anything is inflated: exit
//! 2, one line naming both sizes, nothing written, and quickly (the bound here is generous
//! for a loaded machine; docs/checkpoints.md gives the measured time and memory).

use std::path::Path;
use std::time::{Duration, Instant};

use super::{assert_refusal, file, listing, run_limited, s};

/// What the bombs inflate to.
const BOMB: u64 = 1 << 32;
/// A refusal must come well within this (it takes milliseconds).
const FAST: Duration = Duration::from_secs(10);

/// A raw deflate stream of `BOMB` zero bytes and their CRC-32, without inflating anything
/// that large: one fully flushed 1 MiB block repeated (a full flush resets the history,
/// so each repeat is the same bytes), then an empty final block.
fn zeros_deflated() -> (Vec<u8>, u32) {
    use flate2::{Compress, Compression, FlushCompress};
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    let mut c = Compress::new(Compression::best(), false);
    let mut block = Vec::with_capacity(CHUNK);
    c.compress_vec(&zeros, &mut block, FlushCompress::Full)
        .unwrap();
    assert_eq!(c.total_in(), CHUNK as u64);
    let repeats = (BOMB / CHUNK as u64) as usize;
    let mut out = Vec::with_capacity(block.len() * repeats + 16);
    for _ in 0..repeats {
        out.extend_from_slice(&block);
    }
    let mut end = Vec::with_capacity(16);
    c.compress_vec(&[], &mut end, FlushCompress::Finish)
        .unwrap();
    out.extend(end);
    // CRC-32 of BOMB zeros by doubling one chunk's.
    let mut crc = crc32fast::Hasher::new();
    crc.update(&zeros);
    for _ in 0..repeats.trailing_zeros() {
        let same = crc.clone();
        crc.combine(&same);
    }
    (out, crc.finalize())
}

/// A zip archive of stored members plus one deflated member `raw` of `size` bytes once
/// inflated (zip64 extra fields in both headers, as Python writes for sizes over 4 GiB).
fn zip_with_bomb(stored: &[(&str, &[u8])], name: &str, raw: &[u8], size: u64, crc: u32) -> Vec<u8> {
    struct Member<'a> {
        name: &'a str,
        method: u16,
        data: &'a [u8],
        size: u64,
        crc: u32,
        offset: u64,
    }
    let mut members: Vec<Member> = stored
        .iter()
        .map(|(n, d)| Member {
            name: n,
            method: 0,
            data: d,
            size: d.len() as u64,
            crc: crc32fast::hash(d),
            offset: 0,
        })
        .collect();
    members.push(Member {
        name,
        method: 8,
        data: raw,
        size,
        crc,
        offset: 0,
    });
    let zip64 = |m: &Member, offset: Option<u64>| {
        let mut e = vec![1u8, 0];
        let n = if offset.is_some() { 24u16 } else { 16 };
        e.extend(n.to_le_bytes());
        e.extend(m.size.to_le_bytes());
        e.extend((m.data.len() as u64).to_le_bytes());
        if let Some(o) = offset {
            e.extend(o.to_le_bytes());
        }
        e
    };
    let mut out = Vec::new();
    for m in &mut members {
        m.offset = out.len() as u64;
        let big = m.size > u64::from(u32::MAX);
        let extra = if big { zip64(m, None) } else { Vec::new() };
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(if big { 45u16 } else { 20 }.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(m.method.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend(m.crc.to_le_bytes());
        let (csize, usize_) = if big {
            (u32::MAX, u32::MAX)
        } else {
            (m.data.len() as u32, m.size as u32)
        };
        out.extend(csize.to_le_bytes());
        out.extend(usize_.to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend((extra.len() as u16).to_le_bytes());
        out.extend(m.name.as_bytes());
        out.extend(extra);
        out.extend(m.data);
    }
    let cd = out.len() as u64;
    for m in &members {
        let big = m.size > u64::from(u32::MAX);
        let extra = if big { zip64(m, None) } else { Vec::new() };
        out.extend(0x0201_4b50u32.to_le_bytes());
        out.extend([45, 3, 45, 0]);
        out.extend(0u16.to_le_bytes());
        out.extend(m.method.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend(m.crc.to_le_bytes());
        let (csize, usize_) = if big {
            (u32::MAX, u32::MAX)
        } else {
            (m.data.len() as u32, m.size as u32)
        };
        out.extend(csize.to_le_bytes());
        out.extend(usize_.to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend((extra.len() as u16).to_le_bytes());
        out.extend([0u8; 10]);
        out.extend((m.offset as u32).to_le_bytes());
        out.extend(m.name.as_bytes());
        out.extend(extra);
    }
    let cd_size = out.len() as u64 - cd;
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((cd_size as u32).to_le_bytes());
    out.extend((cd as u32).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// `{"w": float32 tensor of 4 elements}` as torch.save pickles it (storage "0").
fn four_floats_pickle() -> Vec<u8> {
    let mut p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00w".to_vec();
    p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage");
    p.extend(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ");
    p.extend(b"K\x00K\x04\x85K\x01\x85\x89h\x00)RtRu.");
    p
}

/// Runs `build --weights BOMB -o out.onnx` in `dir`: refused fast, naming `needle`,
/// nothing written.
fn refuse_fast(dir: &Path, weights: &Path, needle: &str) {
    let out = dir.join("out.onnx");
    let before = listing(dir);
    let start = Instant::now();
    let o = run_limited(&["build", "--weights", s(weights), "-o", s(&out)], FAST);
    let took = start.elapsed();
    assert_refusal(&o, 2, needle, &weights.display().to_string());
    assert_eq!(
        listing(dir),
        before,
        "{} left files behind",
        weights.display()
    );
    assert!(took < FAST, "{}: refused after {took:?}", weights.display());
    eprintln!("{}: refused in {took:?}", weights.display());
}

#[test]
fn a_pt_whose_storage_deflates_to_4_gib_is_refused_before_inflating() {
    let dir = tempfile::tempdir().unwrap();
    let (raw, crc) = zeros_deflated();
    let bytes = zip_with_bomb(
        &[
            ("bomb/data.pkl", &four_floats_pickle()),
            ("bomb/byteorder", b"little"),
        ],
        "bomb/data/0",
        &raw,
        BOMB,
        crc,
    );
    assert!(bytes.len() < 5 << 20, "{} bytes", bytes.len());
    let pt = file(dir.path(), "bomb.pt", &bytes);
    refuse_fast(
        dir.path(),
        &pt,
        "storage '0' holds 4294967296 bytes, 4 float32 elements need 16",
    );
}

#[test]
fn an_npz_whose_array_deflates_to_4_gib_is_refused_before_inflating() {
    let dir = tempfile::tempdir().unwrap();
    // A .npy header for 4 float32 values, then 4 GiB of zeros after it.
    let mut header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }".to_vec();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(&header);
    // The member: the header stored as its own fully flushed deflate block, then the zeros.
    use flate2::{Compress, Compression, FlushCompress};
    let mut c = Compress::new(Compression::best(), false);
    let mut raw = Vec::with_capacity(256);
    c.compress_vec(&npy, &mut raw, FlushCompress::Full).unwrap();
    let (zeros, zeros_crc) = zeros_deflated();
    raw.extend(zeros);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&npy);
    crc.combine(&crc32fast::Hasher::new_with_initial_len(zeros_crc, BOMB));
    let size = npy.len() as u64 + BOMB;
    let bytes = zip_with_bomb(&[], "w.npy", &raw, size, crc.finalize());
    assert!(bytes.len() < 5 << 20, "{} bytes", bytes.len());
    let npz = file(dir.path(), "bomb.npz", &bytes);
    refuse_fast(
        dir.path(),
        &npz,
        "array 'w': the member declares 4294967296 bytes of data, shape [4] of dtype <f4 needs 16",
    );
}
