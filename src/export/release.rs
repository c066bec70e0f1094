//! Dropping the resident pages of a mapped payload once its bytes are written.
//!
//! Payloads read from files are mapped ([`mblob_runtime::map_file`]), and a page of a mapping
//! stays resident in the process once touched: writing a 512 MiB payload would leave the
//! export holding 512 MiB. After each chunk is written, [`Release::written`] drops the chunk's
//! whole pages with `madvise(MADV_DONTNEED)`, so the export's memory stays a few MiB whatever
//! the payload size.
//!
//! `MADV_DONTNEED` is only harmless where the pages can be read again from their file: it
//! would zero the bytes of anonymous memory (a `Vec`) and undo the writes of a private copy. So
//! pages are dropped only inside a mapping that `/proc/self/smaps` shows as read-only,
//! backed by a file (an inode), and holding no anonymous (copied-on-write) pages; anything
//! else is left alone. The answer is kept per mapping, so `smaps` is read once per payload.

use std::ops::Range;

/// Buffers from this size on are looked at (smaller ones cost more to check than they hold).
const MIN_BUFFER: usize = 1 << 20;

/// The state of one blob's writing: the last mapping found safe, and the last range found
/// not to be.
#[derive(Debug, Default)]
pub(crate) struct Release {
    safe: Option<Range<usize>>,
    unsafe_: Option<Range<usize>>,
}

impl Release {
    /// `written` (a prefix of `buffer`, the bytes a writer was given) has been written: drop
    /// its whole pages when `buffer` lies in a mapping where that is harmless.
    pub(crate) fn written(&mut self, buffer: &[u8], written: usize) {
        if buffer.len() < MIN_BUFFER || written == 0 {
            return;
        }
        let start = buffer.as_ptr() as usize;
        let Some(end) = start.checked_add(buffer.len()) else { return };
        if !self.is_file_backed(start..end) {
            return;
        }
        let page = page_size();
        // Whole pages only: the pages at the edges may hold bytes not yet written.
        let from = start.next_multiple_of(page);
        let to = (start + written) / page * page;
        if to > from {
            drop_pages(from, to - from);
        }
    }

    fn is_file_backed(&mut self, range: Range<usize>) -> bool {
        let within =
            |r: &Option<Range<usize>>| r.as_ref().is_some_and(|m| m.start <= range.start && range.end <= m.end);
        if within(&self.safe) {
            return true;
        }
        if within(&self.unsafe_) {
            return false;
        }
        match read_only_file_mapping(&range) {
            Some(mapping) => {
                self.safe = Some(mapping);
                true
            }
            None => {
                self.unsafe_ = Some(range);
                false
            }
        }
    }
}

/// The mapping holding all of `range`, when it is read-only, file-backed and without anonymous
/// pages (from `/proc/self/smaps`).
fn read_only_file_mapping(range: &Range<usize>) -> Option<Range<usize>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut current: Option<(Range<usize>, bool)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let first = fields.next()?;
        if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            // `start-end perms offset dev inode [path]`
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
                current = None;
                continue;
            };
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("0");
            let candidate = lo <= range.start && range.end <= hi;
            current = candidate.then(|| (lo..hi, !perms.contains('w') && inode != "0"));
        } else if first == "Anonymous:" {
            if let Some((mapping, ok)) = current.take() {
                let anonymous_kib = fields.next().and_then(|v| v.parse::<u64>().ok());
                return (ok && anonymous_kib == Some(0)).then_some(mapping);
            }
        }
    }
    None
}

fn page_size() -> usize {
    rustix::param::page_size()
}

fn drop_pages(start: usize, len: usize) {
    #[allow(unsafe_code)]
    // SAFETY: the range is page-aligned and lies inside a read-only, file-backed private
    // mapping without anonymous pages (checked against `/proc/self/smaps` by the caller), so
    // dropping its pages changes no byte: the next read maps the same file pages again. The
    // mapping stays in place; only its resident pages go.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "madvise(MADV_DONTNEED) failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_of_a_mapped_file_are_dropped_and_read_again_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (_, bytes, mapped) = crate::pack::mapped_test_file(dir.path(), "p.bin", 8 << 20, 13);
        assert!(mapped[..] == bytes[..]);
        let mut r = Release::default();
        r.written(&mapped, mapped.len());
        assert!(r.safe.is_some(), "a mapped file counts as file-backed");
        assert!(mapped[..] == bytes[..], "the bytes read again are the file's");
        // Heap memory is never touched.
        let mut r = Release::default();
        r.written(&bytes, bytes.len());
        assert!(r.safe.is_none() && r.unsafe_.is_some());
        assert!(bytes.iter().any(|&b| b != 0));
    }
}
