//! [`Bytes`]: a cheap, shareable view of payload bytes.
//!
//! Loading a packed `.so` does not copy payloads: each one is a `Bytes` that borrows its range
//! of the blob and keeps the mapping that holds it (the opened library, a mapped file, or an
//! owned buffer) alive for as long as any view exists.
//!
//! A view of a read-only file mapping (the opened library's image, a mapped params file) can
//! also give its pages back ([`Bytes::release`]) once their contents were copied elsewhere: the
//! memory then holds each constant once, and a later read maps the page in again from the file.
//! [`Bytes::write_to`] does the same while it writes a view out: an export of a 512 MiB mapped
//! payload holds a few MiB of it at any time, not 512 MiB.

use std::fmt;
use std::io::{self, Write};
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Gives the memory pages that lie wholly inside a byte range back to the system (for a
/// read-only mapping of a file, whose pages are read again from the file when touched).
pub(crate) type ReleasePages = fn(&[u8]);

/// A shared, immutable byte range. Cloning is cheap (a reference count).
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
    /// How to give the pages of a range back, for an owner that is a read-only file mapping.
    release: Option<ReleasePages>,
}

impl Bytes {
    /// Takes ownership of a buffer.
    pub fn from_vec(v: Vec<u8>) -> Bytes {
        let len = v.len();
        Bytes { owner: Arc::new(v), range: 0..len, release: None }
    }

    /// Views all of `owner`, keeping it alive.
    pub fn from_owner(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Bytes {
        let len = (*owner).as_ref().len();
        Bytes { owner, range: 0..len, release: None }
    }

    /// Views all of `owner`, a read-only mapping of a file whose pages `release` may give back
    /// (their contents never change, so reading them again reads the same bytes).
    pub(crate) fn from_mapping(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, release: ReleasePages) -> Bytes {
        Bytes { release: Some(release), ..Bytes::from_owner(owner) }
    }

    /// True when the bytes are a view of a read-only file mapping, whose pages
    /// [`Bytes::release`] gives back.
    pub(crate) fn is_mapped(&self) -> bool {
        self.release.is_some()
    }

    /// Gives back the memory pages that lie wholly inside this view, when it is a view of a
    /// read-only file mapping (nothing otherwise): after their bytes were copied, so that they
    /// are held once. The view stays valid; reading it again maps the pages in again.
    pub fn release(&self) {
        if let Some(release) = self.release {
            release(self);
        }
    }

    /// Bytes [`Bytes::write_to`] writes before it gives their pages back.
    pub const WRITE_CHUNK: usize = 4 << 20;

    /// Writes all of the view to `out`, [`Bytes::WRITE_CHUNK`] bytes at a time, giving each
    /// written chunk's pages back ([`Bytes::release`]) when the view is of a read-only file
    /// mapping: what was written is read again from the file if it is needed again, so the
    /// process holds one chunk of the view, whatever its size. Other views are written at once.
    ///
    /// # Errors
    /// What `out` returns.
    pub fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.release.is_none() {
            return out.write_all(self);
        }
        let mut at = 0;
        while at < self.len() {
            let end = self.len().min(at.saturating_add(Self::WRITE_CHUNK));
            let chunk = self.slice(at..end).unwrap_or_else(|| Bytes::from_vec(Vec::new()));
            out.write_all(&chunk)?;
            chunk.release();
            at = end;
        }
        Ok(())
    }

    /// A sub-range, or `None` when it lies outside this view.
    pub fn slice(&self, range: Range<usize>) -> Option<Bytes> {
        let start = self.range.start.checked_add(range.start)?;
        let end = self.range.start.checked_add(range.end)?;
        (start <= end && end <= self.range.end).then(|| Bytes {
            owner: self.owner.clone(),
            range: start..end,
            release: self.release,
        })
    }

    /// The sub-range that `part` occupies, when `part` is a slice of this view's bytes.
    pub fn slice_ref(&self, part: &[u8]) -> Option<Bytes> {
        let base = self.as_ref().as_ptr() as usize;
        let start = (part.as_ptr() as usize).checked_sub(base)?;
        self.slice(start..start.checked_add(part.len())?)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.owner).as_ref().get(self.range.clone()).unwrap_or_default()
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self[..] == other[..]
    }
}

impl Eq for Bytes {}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes::from_vec(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_and_check_bounds() {
        let b = Bytes::from_vec((0u8..10).collect());
        let s = b.slice(2..5).unwrap();
        assert_eq!(&s[..], &[2, 3, 4]);
        assert_eq!(&s.slice(1..3).unwrap()[..], &[3, 4]);
        assert!(s.slice(1..4).is_none());
        assert!(b.slice(usize::MAX..usize::MAX).is_none());
        let part = &b[4..6];
        assert_eq!(b.slice_ref(part).unwrap()[..], [4, 5]);
        assert!(s.slice_ref(&[1, 2]).is_none());
    }

    /// The resident KiB of the mapping that starts at `addr` (`Rss:` of `/proc/self/smaps`).
    fn resident_kib(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|l| {
            let start = l.split('-').next().and_then(|a| usize::from_str_radix(a, 16).ok());
            start != Some(addr)
        });
        lines.next().expect("the mapping is listed");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_ascii_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn writing_a_mapped_file_gives_its_pages_back_and_writes_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.bin");
        let bytes: Vec<u8> = (0u32..(24 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let mapped = crate::map_file(&path).unwrap();
        let addr = mapped.as_ptr() as usize;
        let mut out = Vec::with_capacity(bytes.len());
        mapped.write_to(&mut out).unwrap();
        assert!(out == bytes, "the bytes written are the file's");
        // Without giving them back the mapping would hold all 24 MiB: now at most a page at
        // each chunk's edges.
        let kib = resident_kib(addr);
        assert!(kib <= 64, "{kib} KiB of the mapping stay resident");
        assert!(mapped[..] == bytes[..], "read again, the bytes are the file's");
        // A view of a buffer is written at once and left as it is.
        let mut out = Vec::new();
        Bytes::from_vec(bytes.clone()).write_to(&mut out).unwrap();
        assert!(out == bytes);
    }
}
