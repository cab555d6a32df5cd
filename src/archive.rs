//! Zip archives read with every size checked before anything is inflated: the containers
//! of `torch.save` files (stored members, zip64 end records always written) and of NumPy
//! `.npz` files (stored or deflated members, zip64 extra fields).
//!
//! The layout is PKWARE's APPNOTE.TXT 6.3: the end of central directory record (4.3.16)
//! closes the file; when a zip64 end of central directory locator (4.3.15) sits right
//! before it, the zip64 end record (4.3.14) it points to gives the member count and the
//! central directory's size and offset; the central directory (4.3.12) lists every member
//! with its sizes (from the zip64 extra field, 4.5.3, where one does not fit 32 bits) and
//! the offset of its local header (4.3.7), after which its data starts. Offsets are taken
//! as written: nothing is searched for and no data before the archive is guessed at.
//!
//! Why not the `zip` crate: 9.x (9.4.1 to 9.8.1) guesses where the central directory
//! starts from its size (`end record offset - directory size`) without counting the zip64
//! records between them, so a valid torch file whose first central record is 76 bytes long
//! (a 21-character record folder, such as `model_epoch_0001_best.pt`) is refused as
//! "Invalid Central Directory header". Its reads are also not bounded by what the caller
//! expects. Reading the two kinds of archive this program takes is a small job when every
//! bound is explicit, as here.
//!
//! Bounds: the central directory must lie inside the file and list no more members than it
//! has room for; every member's local header is read and checked against its central
//! record when the archive is opened, and members may not overlap (so one compressed
//! stream cannot be listed many times); a member is read only up to the size its central
//! record declares, which the caller checks against what it expects before asking
//! ([`ZipArchive::read`] takes that limit too); a deflated member may not claim more than
//! deflate can produce from its compressed bytes; what is read is checked against the
//! declared size and CRC-32, and a stream that inflates past its declared size is refused.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

/// A reason an archive or member was refused, by what the caller can do about it; each
/// holds the one-line reason (its `Display`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ZipError {
    /// The bytes contradict themselves or the format (cut short, a record missing or
    /// pointing elsewhere, sizes or CRC-32 that do not match): a damaged or forged file.
    #[error("{0}")]
    Damaged(String),
    /// A valid archive using what this reader does not read (several disks, encryption, a
    /// method other than stored and deflate).
    #[error("{0}")]
    Unsupported(String),
    /// Larger than the caller's limit or this reader's (a member, the central directory).
    #[error("{0}")]
    TooLarge(String),
    /// Reading the underlying file failed.
    #[error("{0}")]
    Io(String),
}

/// An archive or member refused ([`ZipError`]), or the value.
pub type ZipResult<T> = std::result::Result<T, ZipError>;

fn damaged(reason: String) -> ZipError {
    ZipError::Damaged(reason)
}

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const LOCAL_LEN: usize = 30;
const CENTRAL_LEN: usize = 46;
const EOCD_LEN: usize = 22;
const LOCATOR_LEN: u64 = 20;
const ZIP64_EOCD_LEN: usize = 56;
/// Largest archive comment (its length field is 16 bits).
const MAX_COMMENT: usize = u16::MAX as usize;
/// Largest central directory read (torch writes about 100 bytes of it per tensor).
const MAX_CENTRAL_DIRECTORY: u64 = 1 << 28;
/// Deflate cannot expand data by more than about 1032:1 (RFC 1951: a 258-byte match per
/// one-bit code at best).
pub const MAX_DEFLATE_RATIO: u64 = 1032;

/// How a member's data is stored (APPNOTE 4.4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// 0: stored as is.
    Stored,
    /// 8: deflate (RFC 1951).
    Deflated,
    /// Any other method: listed, refused when read.
    Other(u16),
}

/// One member of the central directory.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The member's name (UTF-8).
    pub name: String,
    /// How its data is stored.
    pub method: Method,
    /// Bytes of data in the file.
    pub compressed_size: u64,
    /// Bytes once inflated, as declared.
    pub size: u64,
    crc32: u32,
    encrypted: bool,
    /// Where its data starts in the file.
    data_start: u64,
}

/// A zip archive whose central directory has been read and checked.
pub struct ZipArchive<R> {
    reader: R,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn io(e: std::io::Error) -> ZipError {
    ZipError::Io(crate::error::one_line(e))
}

fn read_at<R: Read + Seek>(reader: &mut R, at: u64, buf: &mut [u8]) -> ZipResult<()> {
    reader.seek(SeekFrom::Start(at)).map_err(io)?;
    reader.read_exact(buf).map_err(io)
}

/// Where the central directory is: (offset, size, member count, where it must end by).
fn find_directory<R: Read + Seek>(reader: &mut R, len: u64) -> ZipResult<(u64, u64, u64, u64)> {
    if len < EOCD_LEN as u64 {
        return Err(damaged(format!(
            "{len} bytes is too short for a zip archive"
        )));
    }
    let tail_len = len.min((EOCD_LEN + MAX_COMMENT) as u64) as usize;
    let tail_start = len - tail_len as u64;
    let mut tail = vec![0u8; tail_len];
    read_at(reader, tail_start, &mut tail)?;
    // The end record whose comment reaches exactly to the end of the file, last first.
    let at = (0..=tail_len - EOCD_LEN)
        .rev()
        .find(|&i| {
            u32_at(&tail, i) == EOCD_SIG
                && usize::from(u16_at(&tail, i + 20)) == tail_len - i - EOCD_LEN
        })
        .ok_or_else(|| damaged("no end of central directory record".into()))?;
    let eocd = &tail[at..at + EOCD_LEN];
    let eocd_pos = tail_start + at as u64;
    let (disk, cd_disk) = (u16_at(eocd, 4), u16_at(eocd, 6));
    let (disk_entries, entries) = (u16_at(eocd, 8), u16_at(eocd, 10));
    let (cd_size, cd_offset) = (u32_at(eocd, 12), u32_at(eocd, 16));
    let mut locator = [0u8; LOCATOR_LEN as usize];
    let has_locator = eocd_pos >= LOCATOR_LEN
        && read_at(reader, eocd_pos - LOCATOR_LEN, &mut locator).is_ok()
        && u32_at(&locator, 0) == ZIP64_LOCATOR_SIG;
    if !has_locator {
        if disk != 0 || cd_disk != 0 || disk_entries != entries {
            return Err(ZipError::Unsupported(
                "multi-disk archives are not supported".into(),
            ));
        }
        if entries == u16::MAX || cd_size == u32::MAX || cd_offset == u32::MAX {
            return Err(damaged("zip64 sizes without a zip64 end record".into()));
        }
        return Ok((
            u64::from(cd_offset),
            u64::from(cd_size),
            u64::from(entries),
            eocd_pos,
        ));
    }
    let locator_pos = eocd_pos - LOCATOR_LEN;
    let (z_disk, z_offset, z_disks) = (
        u32_at(&locator, 4),
        u64_at(&locator, 8),
        u32_at(&locator, 16),
    );
    if z_disk != 0 || z_disks > 1 {
        return Err(ZipError::Unsupported(
            "multi-disk archives are not supported".into(),
        ));
    }
    if z_offset
        .checked_add(ZIP64_EOCD_LEN as u64)
        .is_none_or(|end| end > locator_pos)
    {
        return Err(damaged(format!(
            "the zip64 end record at {z_offset} does not fit before its locator at {locator_pos}"
        )));
    }
    let mut z = [0u8; ZIP64_EOCD_LEN];
    read_at(reader, z_offset, &mut z)?;
    if u32_at(&z, 0) != ZIP64_EOCD_SIG {
        return Err(damaged(format!("no zip64 end record at {z_offset}")));
    }
    let (disk, cd_disk) = (u32_at(&z, 16), u32_at(&z, 20));
    let (disk_entries, entries) = (u64_at(&z, 24), u64_at(&z, 32));
    if disk != 0 || cd_disk != 0 || disk_entries != entries {
        return Err(ZipError::Unsupported(
            "multi-disk archives are not supported".into(),
        ));
    }
    Ok((u64_at(&z, 48), u64_at(&z, 40), entries, z_offset))
}

/// The central records in `cd`: (entry without its data offset, local header offset).
fn central_records(cd: &[u8], count: u64) -> ZipResult<Vec<(Entry, u64)>> {
    let mut out: Vec<(Entry, u64)> = Vec::with_capacity(count as usize);
    let mut names = std::collections::HashSet::new();
    let mut pos = 0usize;
    for i in 0..count {
        let (entry, offset, end) = central_record(cd, pos, i)?;
        if !names.insert(entry.name.clone()) {
            return Err(damaged(format!("member '{}' appears twice", entry.name)));
        }
        out.push((entry, offset));
        pos = end;
    }
    Ok(out)
}

/// The central record `i`, at `pos` in `cd`: (entry without its data offset, local header
/// offset, where the next record starts).
fn central_record(cd: &[u8], pos: usize, i: u64) -> ZipResult<(Entry, u64, usize)> {
    let record = cd
        .get(pos..pos + CENTRAL_LEN)
        .filter(|r| u32_at(r, 0) == CENTRAL_SIG)
        .ok_or_else(|| {
            damaged(format!(
                "central directory record {i} is missing or damaged"
            ))
        })?;
    let flags = u16_at(record, 8);
    let method = match u16_at(record, 10) {
        0 => Method::Stored,
        8 => Method::Deflated,
        m => Method::Other(m),
    };
    let crc32 = u32_at(record, 16);
    let mut compressed_size = u64::from(u32_at(record, 20));
    let mut size = u64::from(u32_at(record, 24));
    let name_len = usize::from(u16_at(record, 28));
    let extra_len = usize::from(u16_at(record, 30));
    let comment_len = usize::from(u16_at(record, 32));
    let disk = u16_at(record, 34);
    let mut offset = u64::from(u32_at(record, 42));
    let name_at = pos + CENTRAL_LEN;
    let end = name_at + name_len + extra_len + comment_len;
    if end > cd.len() {
        return Err(damaged(format!(
            "central directory record {i} runs past the directory"
        )));
    }
    let name = std::str::from_utf8(&cd[name_at..name_at + name_len])
        .map_err(|_| damaged(format!("member {i}'s name is not UTF-8")))?
        .to_string();
    let extra = &cd[name_at + name_len..name_at + name_len + extra_len];
    apply_zip64_extra(extra, &name, [&mut size, &mut compressed_size, &mut offset])?;
    if disk != 0 && disk != u16::MAX {
        return Err(ZipError::Unsupported(
            "multi-disk archives are not supported".into(),
        ));
    }
    if [size, compressed_size, offset].contains(&u64::from(u32::MAX)) {
        return Err(damaged(format!(
            "member '{name}': zip64 sizes without a zip64 extra field"
        )));
    }
    let entry = Entry {
        name,
        method,
        compressed_size,
        size,
        crc32,
        encrypted: flags & 0x41 != 0,
        data_start: 0,
    };
    Ok((entry, offset, end))
}

/// Reads the zip64 extra field among the extra fields `extra` of member `name` into
/// `values` (size, compressed size, local header offset): it holds, in this order, each
/// value whose 32-bit field is full.
fn apply_zip64_extra(mut extra: &[u8], name: &str, mut values: [&mut u64; 3]) -> ZipResult<()> {
    while extra.len() >= 4 {
        let (id, n) = (u16_at(extra, 0), usize::from(u16_at(extra, 2)));
        let data = extra.get(4..4 + n).ok_or_else(|| {
            damaged(format!(
                "member '{name}': an extra field runs past its record"
            ))
        })?;
        if id == 1 {
            let mut fields = data.chunks_exact(8).map(|c| u64_at(c, 0));
            for value in values.iter_mut() {
                if **value == u64::from(u32::MAX) {
                    **value = fields.next().ok_or_else(|| {
                        damaged(format!(
                            "member '{name}': its zip64 extra field is too short"
                        ))
                    })?;
                }
            }
        }
        extra = &extra[4 + n..];
    }
    Ok(())
}

/// Refuses a central directory of `cd_size` bytes at `cd_offset` listing `count` members
/// that runs past its end record at `cd_end`, is too large, or has no room for them.
fn check_directory_bounds(cd_offset: u64, cd_size: u64, count: u64, cd_end: u64) -> ZipResult<()> {
    if cd_offset
        .checked_add(cd_size)
        .is_none_or(|end| end > cd_end)
    {
        return Err(damaged(format!(
            "the central directory ({cd_size} bytes at {cd_offset}) runs past its end record at {cd_end}"
        )));
    }
    if cd_size > MAX_CENTRAL_DIRECTORY {
        return Err(ZipError::TooLarge(format!(
            "a central directory of {cd_size} bytes is too large"
        )));
    }
    if count > cd_size / CENTRAL_LEN as u64 {
        return Err(damaged(format!(
            "{count} members do not fit a central directory of {cd_size} bytes"
        )));
    }
    Ok(())
}

/// Reads the local header of `entry` at `offset` and sets where its data starts; refuses
/// a header that is missing, names another member, or whose data runs into the central
/// directory at `cd_offset`. Returns where its data ends.
fn locate_data<R: Read + Seek>(
    reader: &mut R,
    entry: &mut Entry,
    offset: u64,
    cd_offset: u64,
) -> ZipResult<u64> {
    let name = &entry.name;
    let mut local = [0u8; LOCAL_LEN];
    if offset
        .checked_add(LOCAL_LEN as u64)
        .is_none_or(|e| e > cd_offset)
    {
        return Err(damaged(format!(
            "member '{name}' starts past the archive's data"
        )));
    }
    read_at(reader, offset, &mut local)?;
    if u32_at(&local, 0) != LOCAL_SIG {
        return Err(damaged(format!(
            "member '{name}' has no local header at {offset}"
        )));
    }
    let name_len = u64::from(u16_at(&local, 26));
    let extra_len = u64::from(u16_at(&local, 28));
    let mut local_name = vec![0u8; name_len as usize];
    reader.read_exact(&mut local_name).map_err(io)?;
    if local_name != name.as_bytes() {
        return Err(damaged(format!(
            "member '{name}' is named '{}' in its local header",
            String::from_utf8_lossy(&local_name)
        )));
    }
    entry.data_start = offset + LOCAL_LEN as u64 + name_len + extra_len;
    let data_end = entry.data_start.checked_add(entry.compressed_size);
    match data_end {
        Some(e) if e <= cd_offset => Ok(e),
        _ => Err(damaged(format!(
            "member '{}' ({} bytes at {}) runs into the central directory at {cd_offset}",
            entry.name, entry.compressed_size, entry.data_start
        ))),
    }
}

impl<R: Read + Seek> ZipArchive<R> {
    /// Reads and checks the central directory of an archive of `len` bytes, and every
    /// member's local header.
    pub fn new(mut reader: R, len: u64) -> ZipResult<Self> {
        let (cd_offset, cd_size, count, cd_end) = find_directory(&mut reader, len)?;
        check_directory_bounds(cd_offset, cd_size, count, cd_end)?;
        let mut cd = vec![0u8; cd_size as usize];
        read_at(&mut reader, cd_offset, &mut cd)?;
        let records = central_records(&cd, count)?;
        let mut entries = Vec::with_capacity(records.len());
        let mut spans = Vec::with_capacity(records.len());
        for (mut entry, offset) in records {
            let data_end = locate_data(&mut reader, &mut entry, offset, cd_offset)?;
            spans.push((offset, data_end, entries.len()));
            entries.push(entry);
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(damaged(format!(
                "members '{}' and '{}' overlap",
                entries[w[0].2].name, entries[w[1].2].name
            )));
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        Ok(ZipArchive {
            reader,
            entries,
            by_name,
        })
    }

    /// The members, in central directory order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The index of the member named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// A reader of member `index`'s inflated bytes: exactly its declared size, checked
    /// against its CRC-32 and refused if the data ends early or inflates past it.
    pub fn open(&mut self, index: usize) -> ZipResult<Member<'_, R>> {
        let entry = self.entries[index].clone();
        let name = &entry.name;
        if entry.encrypted {
            return Err(ZipError::Unsupported(format!(
                "member '{name}' is encrypted"
            )));
        }
        let raw = match entry.method {
            Method::Stored if entry.compressed_size != entry.size => {
                return Err(damaged(format!(
                    "stored member '{name}' declares {} bytes in {} bytes of data",
                    entry.size, entry.compressed_size
                )))
            }
            Method::Deflated
                if entry.size > entry.compressed_size.saturating_mul(MAX_DEFLATE_RATIO) =>
            {
                return Err(damaged(format!(
                    "member '{name}' declares {} bytes, more than deflate can make of its {} bytes",
                    entry.size, entry.compressed_size
                )))
            }
            Method::Other(m) => {
                return Err(ZipError::Unsupported(format!(
                    "member '{name}' uses compression method {m} (stored and deflate are read)"
                )))
            }
            _ => {
                self.reader
                    .seek(SeekFrom::Start(entry.data_start))
                    .map_err(io)?;
                (&mut self.reader).take(entry.compressed_size)
            }
        };
        let inner = match entry.method {
            Method::Deflated => Inner::Deflated(flate2::read::DeflateDecoder::new(raw)),
            _ => Inner::Stored(raw),
        };
        Ok(Member {
            inner,
            left: entry.size,
            crc: crc32fast::Hasher::new(),
            entry,
        })
    }

    /// Member `index` whole, refused before anything is inflated if it declares more than
    /// `limit` bytes.
    pub fn read(&mut self, index: usize, limit: u64) -> ZipResult<Vec<u8>> {
        let entry = &self.entries[index];
        if entry.size > limit {
            return Err(ZipError::TooLarge(format!(
                "member '{}' declares {} bytes, more than the {limit} expected",
                entry.name, entry.size
            )));
        }
        let size = entry.size;
        // Opening checks the size against what the method can produce from the file's
        // bytes; only then is room made for it.
        let mut member = self.open(index)?;
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        // A member's own checks fail as InvalidData (see [`Member`]); anything else is the file.
        member.read_to_end(&mut bytes).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => damaged(crate::error::one_line(e)),
            _ => io(e),
        })?;
        Ok(bytes)
    }

    /// Gives the reader back.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

enum Inner<'a, R> {
    Stored(std::io::Take<&'a mut R>),
    Deflated(flate2::read::DeflateDecoder<std::io::Take<&'a mut R>>),
}

impl<R: Read> Read for Inner<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Inner::Stored(r) => r.read(buf),
            Inner::Deflated(r) => r.read(buf),
        }
    }
}

/// The inflated bytes of one member (see [`ZipArchive::open`]); its errors are
/// `InvalidData` with a one-line message naming the member.
pub struct Member<'a, R> {
    inner: Inner<'a, R>,
    left: u64,
    crc: crc32fast::Hasher,
    entry: Entry,
}

impl<R> Member<'_, R> {
    /// The member's central directory entry.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }
}

impl<R: Read> Read for Member<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let name = &self.entry.name;
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self
            .inner
            .read(&mut buf[..want])
            .map_err(|e| bad(format!("member '{name}': {}", crate::error::one_line(e))))?;
        if n == 0 {
            return Err(bad(format!(
                "member '{name}' ends {} bytes short of the {} it declares",
                self.left, self.entry.size
            )));
        }
        self.left -= n as u64;
        self.crc.update(&buf[..n]);
        if self.left == 0 {
            if self.crc.clone().finalize() != self.entry.crc32 {
                return Err(bad(format!("member '{name}' fails its CRC-32 check")));
            }
            let mut more = [0u8; 1];
            if self.inner.read(&mut more).is_ok_and(|n| n > 0) {
                return Err(bad(format!(
                    "member '{name}' inflates past the {} bytes it declares",
                    self.entry.size
                )));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
