//! A `.tar` export: the objects that a link would have used, in a POSIX ustar archive, as
//! TVM's `export_library("x.tar")` makes (its `load_module` untars and links them; TVM's
//! `cc.create_staticlib` turns them into a static archive for system-lib builds).
//!
//! The archive is written here, without a `tar` program or crate: regular files only, fixed
//! metadata (mode 0644, owner 0, mtime 0) so that the same inputs give the same bytes.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A tar block.
const BLOCK: usize = 512;
/// GNU tar and Python's tarfile pad archives to a multiple of this (20 blocks).
const RECORD: u64 = 20 * BLOCK as u64;
/// Member names must fit the ustar `name` field with its NUL.
const MAX_NAME: usize = 99;

/// Writes a tar archive at `out` holding `members` (name in the archive, file on disk), in
/// order. Each file is streamed, never held in memory whole.
pub(crate) fn write_tar(members: &[(String, PathBuf)], out: &Path) -> Result<()> {
    let _span = tracing::info_span!("tar", members = members.len(), out = %out.display()).entered();
    let file = File::create(out).map_err(Error::io(out, "cannot create"))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut total: u64 = 0;
    for (name, path) in members {
        let mut src = File::open(path).map_err(Error::io(path, "cannot read"))?;
        let len = src.metadata().map_err(Error::io(path, "cannot read"))?.len();
        let head = header(name, len)?;
        w.write_all(&head).map_err(Error::io(out, "cannot write"))?;
        let copied = io::copy(&mut (&mut src).take(len), &mut w).map_err(|e| copy_error(e, path, out))?;
        if copied != len {
            return Err(Error::Io {
                path: path.clone(),
                action: "changed while being archived",
                source: io::Error::from(io::ErrorKind::UnexpectedEof),
            });
        }
        let pad = padding(len, BLOCK as u64);
        w.write_all(&vec![0; pad as usize]).map_err(Error::io(out, "cannot write"))?;
        total = total.saturating_add(BLOCK as u64).saturating_add(len).saturating_add(pad);
    }
    // The end: two zero blocks, then zeros up to a whole record.
    let end = 2 * BLOCK as u64;
    let tail = end + padding(total.saturating_add(end), RECORD);
    io::copy(&mut io::repeat(0).take(tail), &mut w).map_err(Error::io(out, "cannot write"))?;
    let file = w.into_inner().map_err(|e| Error::Io {
        path: out.to_owned(),
        action: "cannot write",
        source: e.into_error(),
    })?;
    file.sync_all().map_err(Error::io(out, "cannot write"))?;
    Ok(())
}

/// Bytes of padding that bring `len` to a multiple of `unit`.
fn padding(len: u64, unit: u64) -> u64 {
    (unit - len % unit) % unit
}

/// A read error names the member, a write error the archive.
fn copy_error(e: io::Error, member: &Path, out: &Path) -> Error {
    // io::copy cannot say which side failed; the archive is far likelier (a full disk), but an
    // unreadable member must not be blamed on the archive. Re-reading tells them apart.
    match File::open(member).and_then(|mut f| f.read(&mut [0u8; 1])) {
        Err(_) => Error::Io { path: member.to_owned(), action: "cannot read", source: e },
        Ok(_) => Error::Io { path: out.to_owned(), action: "cannot write", source: e },
    }
}

/// The ustar header of a regular file.
fn header(name: &str, len: u64) -> Result<[u8; BLOCK]> {
    if name.is_empty() || name.len() > MAX_NAME || !name.is_ascii() || name.contains('\0') {
        return Err(Error::Invalid {
            what: format!("tar member name `{name}`"),
            detail: format!("must be 1 to {MAX_NAME} ASCII bytes"),
        });
    }
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    if len < 1 << 33 {
        octal(&mut h[124..136], len);
    } else {
        // GNU base-256 for 8 GiB and more: the high bit of the first byte, then big-endian.
        h[124] = 0x80;
        h[128..136].copy_from_slice(&len.to_be_bytes());
    }
    octal(&mut h[136..148], 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h[329..337], 0);
    octal(&mut h[337..345], 0);
    // The checksum is taken with its own field read as spaces.
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    octal(&mut h[148..155], sum);
    Ok(h)
}

/// Writes `value` as zero-padded octal digits followed by a NUL, filling `field`.
fn octal(field: &mut [u8], mut value: u64) {
    let Some((nul, digits)) = field.split_last_mut() else { return };
    *nul = 0;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (value & 7) as u8;
        value >>= 3;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields() {
        let h = header("lib0.o", 1234).unwrap();
        assert_eq!(&h[..7], b"lib0.o\0");
        assert_eq!(&h[124..136], b"00000002322\0");
        assert_eq!(&h[257..265], b"ustar\x0000");
        // The checksum: six octal digits, NUL, space.
        let stored = std::str::from_utf8(&h[148..154]).unwrap();
        let mut copy = h;
        copy[148..156].fill(b' ');
        let sum: u64 = copy.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(u64::from_str_radix(stored, 8).unwrap(), sum);
        assert_eq!(&h[154..156], b"\0 ");
    }

    #[test]
    fn huge_sizes_use_base_256() {
        let h = header("big.o", 9 << 30).unwrap();
        assert_eq!(h[124], 0x80);
        assert_eq!(u64::from_be_bytes(h[128..136].try_into().unwrap()), 9 << 30);
    }

    #[test]
    fn bad_names_are_errors() {
        assert!(header("", 0).is_err());
        assert!(header(&"x".repeat(100), 0).is_err());
        assert!(header("é.o", 0).is_err());
    }
}
