use std::io::{Cursor, Write};

use super::*;

/// One member as the builder writes it.
struct M {
    name: String,
    /// The bytes in the file (already deflated for method 8).
    data: Vec<u8>,
    method: u16,
    /// The declared inflated size.
    size: u64,
    crc: u32,
    flags: u16,
    /// Declare the sizes through a zip64 extra field in the central record.
    zip64_extra: bool,
}

fn stored(name: &str, data: &[u8]) -> M {
    M {
        name: name.into(),
        data: data.to_vec(),
        method: 0,
        size: data.len() as u64,
        crc: crc32fast::hash(data),
        flags: 0,
        zip64_extra: false,
    }
}

fn deflated(name: &str, data: &[u8]) -> M {
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(data).unwrap();
    M {
        data: enc.finish().unwrap(),
        method: 8,
        ..stored(name, data)
    }
}

/// A zip archive of `members`, with the zip64 end records torch always writes when
/// `zip64_end`.
fn build(members: &[M], zip64_end: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offsets = Vec::new();
    for m in members {
        offsets.push(out.len() as u32);
        out.extend(LOCAL_SIG.to_le_bytes());
        out.extend(20u16.to_le_bytes());
        out.extend(m.flags.to_le_bytes());
        out.extend(m.method.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend(m.crc.to_le_bytes());
        out.extend((m.data.len() as u32).to_le_bytes());
        out.extend((m.size as u32).to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(m.name.as_bytes());
        out.extend(&m.data);
    }
    let cd_offset = out.len() as u64;
    for (m, offset) in members.iter().zip(offsets) {
        let mut extra = Vec::new();
        let (mut csize, mut size) = (m.data.len() as u32, m.size as u32);
        if m.zip64_extra {
            extra.extend(1u16.to_le_bytes());
            extra.extend(16u16.to_le_bytes());
            extra.extend(m.size.to_le_bytes());
            extra.extend((m.data.len() as u64).to_le_bytes());
            (csize, size) = (u32::MAX, u32::MAX);
        }
        out.extend(CENTRAL_SIG.to_le_bytes());
        out.extend([0x1e, 3, 20, 0]);
        out.extend(m.flags.to_le_bytes());
        out.extend(m.method.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend(m.crc.to_le_bytes());
        out.extend(csize.to_le_bytes());
        out.extend(size.to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend((extra.len() as u16).to_le_bytes());
        out.extend([0u8; 6]); // comment length, disk, internal attributes
        out.extend(0u32.to_le_bytes());
        out.extend(offset.to_le_bytes());
        out.extend(m.name.as_bytes());
        out.extend(extra);
    }
    let cd_size = out.len() as u64 - cd_offset;
    let n = members.len() as u64;
    if zip64_end {
        let at = out.len() as u64;
        out.extend(ZIP64_EOCD_SIG.to_le_bytes());
        out.extend(44u64.to_le_bytes());
        out.extend([0x1e, 3, 45, 0]);
        out.extend([0u8; 8]);
        out.extend(n.to_le_bytes());
        out.extend(n.to_le_bytes());
        out.extend(cd_size.to_le_bytes());
        out.extend(cd_offset.to_le_bytes());
        out.extend(ZIP64_LOCATOR_SIG.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(at.to_le_bytes());
        out.extend(1u32.to_le_bytes());
    }
    out.extend(EOCD_SIG.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((n as u16).to_le_bytes());
    out.extend((n as u16).to_le_bytes());
    out.extend((cd_size as u32).to_le_bytes());
    out.extend((cd_offset as u32).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// The reason of a refusal that must be [`ZipError::Damaged`].
fn damaged(e: ZipError) -> String {
    match e {
        ZipError::Damaged(reason) => reason,
        other => panic!("not refused as damaged: {other:?}"),
    }
}

/// The reason of a refusal that must be [`ZipError::Unsupported`].
fn unsupported(e: ZipError) -> String {
    match e {
        ZipError::Unsupported(reason) => reason,
        other => panic!("not refused as unsupported: {other:?}"),
    }
}

fn open(bytes: Vec<u8>) -> ZipResult<ZipArchive<Cursor<Vec<u8>>>> {
    let len = bytes.len() as u64;
    ZipArchive::new(Cursor::new(bytes), len)
}

fn read_all(bytes: Vec<u8>) -> ZipResult<Vec<(String, Vec<u8>)>> {
    let mut a = open(bytes)?;
    (0..a.entries().len())
        .map(|i| Ok((a.entries()[i].name.clone(), a.read(i, u64::MAX)?)))
        .collect()
}

#[test]
fn torch_layouts_read_whatever_the_record_folder_length() {
    // torch.save writes zip64 end records; with a 21-character folder the first central
    // record is 46 + 30 = 76 bytes, the length of those records together, which is where
    // zip 9.x mistakes the second record for the start of the directory.
    for folder_len in 1..=64 {
        let folder = "m".repeat(folder_len);
        let pickle = b"\x80\x02}q\x00.".to_vec();
        let storage: Vec<u8> = (0..64).collect();
        let bytes = build(
            &[
                stored(&format!("{folder}/data.pkl"), &pickle),
                stored(&format!("{folder}/byteorder"), b"little"),
                stored(&format!("{folder}/data/0"), &storage),
                stored(&format!("{folder}/version"), b"3\n"),
            ],
            true,
        );
        let got = read_all(bytes).unwrap_or_else(|e| panic!("{folder_len}: {e}"));
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (format!("{folder}/data.pkl"), pickle));
        assert_eq!(got[2].1, storage);
    }
}

#[test]
fn stored_deflated_and_zip64_members_read() {
    let text: Vec<u8> = b"gMLP ".iter().copied().cycle().take(5000).collect();
    let mut big_extra = deflated("b.npy", &text);
    big_extra.zip64_extra = true;
    let got = read_all(build(
        &[stored("a.npy", b"abc"), big_extra, stored("empty", b"")],
        false,
    ))
    .unwrap();
    assert_eq!(got[0].1, b"abc");
    assert_eq!(got[1].1, text);
    assert!(got[2].1.is_empty());
    // What Python's zipfile and the zip crate write reads too.
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    w.start_file("x.npy", opts).unwrap();
    w.write_all(&text).unwrap();
    let got = read_all(w.finish().unwrap().into_inner()).unwrap();
    assert_eq!(got, [("x.npy".to_string(), text)]);
}

#[test]
fn declared_sizes_are_checked_before_reading() {
    let zeros = vec![0u8; 1 << 20];
    let mut a = open(build(&[deflated("big", &zeros)], false)).unwrap();
    let e = a.read(0, 16).unwrap_err();
    assert_eq!(
        e,
        ZipError::TooLarge("member 'big' declares 1048576 bytes, more than the 16 expected".into())
    );
    assert_eq!(a.read(0, 1 << 20).unwrap(), zeros);

    // A small declared size over a stream that inflates to much more.
    let mut lying = deflated("bomb", &zeros);
    lying.size = 16;
    lying.crc = crc32fast::hash(&zeros[..16]);
    damaged(read_all(build(&[lying], false)).unwrap_err());

    // More than deflate can make of the bytes present.
    let mut ratio = deflated("ratio", b"tiny");
    ratio.size = 1 << 40;
    ratio.zip64_extra = true;
    damaged(read_all(build(&[ratio], false)).unwrap_err());

    let mut short = stored("short", b"abcd");
    short.size = 8;
    damaged(read_all(build(&[short], false)).unwrap_err());

    let mut ends = deflated("ends", b"abcdef");
    ends.size = 9;
    damaged(read_all(build(&[ends], false)).unwrap_err());

    let mut crc = stored("crc", b"abcd");
    crc.crc ^= 1;
    let e = damaged(read_all(build(&[crc], false)).unwrap_err());
    // The rendering of a refusal: the member named, then the reason.
    assert_eq!(e, "member 'crc' fails its CRC-32 check");
}

#[test]
fn broken_and_hostile_directories_are_refused() {
    let err = |bytes: Vec<u8>| damaged(open(bytes).err().expect("refused"));
    err(b"PK\x03\x04".to_vec());
    err(vec![0; 100]);
    let good = build(&[stored("a", b"abc"), stored("b", b"def")], true);
    // Truncated anywhere: refused, never a panic.
    for cut in 0..good.len() {
        assert!(open(good[..cut].to_vec()).is_err(), "cut at {cut}");
    }
    // A second record pointing at the first member's local header.
    let mut twice = build(&[stored("a", b"abc"), stored("b", b"abc")], false);
    let cd = twice.len() - 22 - 2 * (46 + 1);
    let offset_field = cd + 46 + 1 + 42;
    twice[offset_field..offset_field + 4].copy_from_slice(&0u32.to_le_bytes());
    err(twice);
    let mut same = build(&[stored("a", b"abc"), stored("a", b"abc")], false);
    err(same.clone());
    // Many central records claimed in a directory too small for them.
    let n = same.len() - 22 + 10;
    same[n..n + 2].copy_from_slice(&60000u16.to_le_bytes());
    same[n - 2..n].copy_from_slice(&60000u16.to_le_bytes());
    err(same);
    let mut enc = stored("secret", b"abc");
    enc.flags = 1;
    let mut a = open(build(&[enc], false)).unwrap();
    assert_eq!(
        unsupported(a.read(0, 10).unwrap_err()),
        "member 'secret' is encrypted"
    );
    let mut bz = stored("bz", b"abc");
    bz.method = 12;
    let mut a = open(build(&[bz], false)).unwrap();
    unsupported(a.read(0, 10).unwrap_err());
}

#[test]
fn overlapping_members_are_refused() {
    // Two central records with the same local header and name but different central
    // names cannot pass the name check, so overlap is built from data that runs on.
    let mut bytes = build(&[stored("a", b"abcdefgh"), stored("b", b"ij")], false);
    let cd = bytes.len() - 22 - 2 * (46 + 1);
    // Member a claims 20 bytes of data: into member b's local header.
    bytes[cd + 20..cd + 24].copy_from_slice(&20u32.to_le_bytes());
    bytes[cd + 24..cd + 28].copy_from_slice(&20u32.to_le_bytes());
    let e = open(bytes).err().unwrap();
    assert_eq!(e, ZipError::Damaged("members 'a' and 'b' overlap".into()));
}
