//! Where a buffer's bytes lie in a file, when the buffer is a read-only mapping of that file.
//!
//! Payloads read from files are mapped ([`mblob_runtime::map_file`]), so when the serializer
//! writes a large payload it hands over a slice of such a mapping. The fast C form
//! ([`super::c`]) asks [`MappedFiles::span`] about each large slice and has the assembler
//! `.incbin` those bytes from their own file, instead of copying them into a blob file first:
//! the blob's bytes are then read once by the assembler, not written, read and written again.
//!
//! The mapping is looked up in `/proc/self/maps`. Its path is trusted only when `stat` of that
//! path gives the mapping's device and inode, the mapping is not writable, and the file holds
//! the whole span; anything else (a deleted or renamed file, a name the maps line cannot carry,
//! heap memory) answers `None`, and the caller copies the bytes as before.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Buffers smaller than this are not looked up: copying them costs less than reading
/// `/proc/self/maps`.
pub(crate) const MIN_SPAN: usize = 256 << 10;

/// A buffer's place in a file: `len` bytes from `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileSpan {
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
}

/// Answers [`MappedFiles::span`], keeping the last mapping found (a payload comes in many
/// consecutive slices of one mapping).
#[derive(Debug, Default)]
pub(crate) struct MappedFiles {
    last: Option<Mapping>,
}

#[derive(Debug, Clone)]
struct Mapping {
    range: Range<usize>,
    /// File offset of `range.start`.
    offset: u64,
    path: PathBuf,
}

impl MappedFiles {
    /// Where `buf` lies in a file, when it lies within one read-only file mapping whose file
    /// still holds all of it; `None` otherwise (and for buffers under [`MIN_SPAN`]).
    pub(crate) fn span(&mut self, buf: &[u8]) -> Option<FileSpan> {
        if buf.len() < MIN_SPAN {
            return None;
        }
        let start = buf.as_ptr() as usize;
        let range = start..start.checked_add(buf.len())?;
        let within = |m: &Mapping| m.range.start <= range.start && range.end <= m.range.end;
        let mapping = match self.last.as_ref().filter(|m| within(m)) {
            Some(m) => m.clone(),
            None => {
                let m = find_mapping(&range)?;
                self.last = Some(m.clone());
                m
            }
        };
        let offset = mapping.offset + (range.start - mapping.range.start) as u64;
        // The file may be shorter than the mapping (its last page runs past the end).
        let len = std::fs::metadata(&mapping.path).ok()?.len();
        (offset + buf.len() as u64 <= len).then_some(FileSpan { path: mapping.path, offset })
    }
}

/// The read-only file mapping holding all of `range`, from `/proc/self/maps`.
fn find_mapping(range: &Range<usize>) -> Option<Mapping> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .find_map(|line| parse_line(line).filter(|(m, _, _)| m.range.start <= range.start && range.end <= m.range.end))
        .and_then(|(m, dev, inode)| same_file(&m.path, dev, inode).then_some(m))
}

/// One maps line: `start-end perms offset major:minor inode path`, for read-only mappings of
/// a named file; with the device and inode to check the path against.
fn parse_line(line: &str) -> Option<(Mapping, (u32, u32), u64)> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start();
        let end = t.find(' ').unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        f
    };
    let (lo, hi) = field().split_once('-')?;
    let perms = field();
    let offset = u64::from_str_radix(field(), 16).ok()?;
    let (major, minor) = field().split_once(':')?;
    let inode: u64 = field().parse().ok()?;
    let path = rest.trim_start();
    if perms.contains('w') || inode == 0 || !path.starts_with('/') {
        return None;
    }
    let range = usize::from_str_radix(lo, 16).ok()?..usize::from_str_radix(hi, 16).ok()?;
    let dev = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    Some((Mapping { range, offset, path: PathBuf::from(path) }, dev, inode))
}

/// Whether `path` is the file with this device and inode (a maps line shows a deleted
/// file's old name with " (deleted)", and a renamed one's new name only for new mappings).
fn same_file(path: &Path, dev: (u32, u32), inode: u64) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|m| m.is_file() && m.ino() == inode && (libc::major(m.dev()), libc::minor(m.dev())) == dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_is_found_and_heap_memory_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes, mapped) = super::super::mapped_test_file(dir.path(), "payload.bin", 2 << 20, 11);
        let mut files = MappedFiles::default();
        let span = files.span(&mapped[4096..4096 + (1 << 20)]).expect("a slice of the mapping");
        assert_eq!(span.path.canonicalize().unwrap(), path.canonicalize().unwrap());
        assert_eq!(span.offset, 4096);
        // The kept mapping answers the next slice too.
        assert_eq!(files.span(&mapped[1 << 20..]).map(|s| s.offset), Some(1 << 20));
        assert_eq!(files.span(&bytes), None, "heap memory");
        assert_eq!(files.span(&mapped[..1024]), None, "too small to look up");
    }

    #[test]
    fn a_file_shortened_after_mapping_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payload.bin");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let mapped = mblob_runtime::map_file(&path).unwrap();
        let head = mapped[..512 << 10].to_vec();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(256 << 10).unwrap();
        let mut files = MappedFiles::default();
        // (Reading the mapping past the new end would fault; only the address is looked at.)
        let view = &mapped[..];
        assert_eq!(files.span(&view[256 << 10..768 << 10]), None);
        assert_eq!(head.len(), 512 << 10);
    }
}
