//! The tvm-ffi body (TVM 0.22 and later, symbol `__tvm_ffi__library_bin`).
//!
//! ```text
//! body   := indptr:vec<u64>  child_indices:vec<u64>  module{len(indptr) - 1}
//! module := kind:str  [ bytes:str ]      # bytes present iff kind != "_lib"
//! ```
//!
//! The tree comes first and fixes the number of modules; every payload is framed, so a
//! reader can keep kinds it does not know as raw bytes. `_lib` is always written.

use std::io::{self, Write};

use super::error::{FormatError, FormatErrorKind};
use super::stream::{self, Reader};
use super::{BlobEntry, Entry, EntryKind, ImportTree, Layout, LIB_KEY};

/// Parses a tvm-ffi body whose first byte lies at `base`.
pub(crate) fn parse_body(body: &[u8], base: u64) -> Result<(Vec<Entry<'_>>, Option<ImportTree>), FormatError> {
    let mut r = Reader::new(body, base);
    let tree_at = r.offset();
    let row_ptr = r.read_vec_u64("indptr")?;
    let child_indices = r.read_vec_u64("child_indices")?;
    let tree = ImportTree { row_ptr, child_indices };
    let modules = tree
        .row_ptr
        .len()
        .checked_sub(1)
        .ok_or_else(|| FormatError::new(tree_at, FormatErrorKind::RowPtrLength { expected: 1, found: 0 }))?;
    // Each module needs at least its key's length field.
    if modules as u64 > r.remaining() as u64 / 8 {
        return Err(FormatError::new(
            tree_at,
            FormatErrorKind::LengthTooLarge { what: "indptr", len: modules as u64, remaining: r.remaining() as u64 },
        ));
    }
    tree.validate(modules).map_err(|k| FormatError::new(tree_at, k))?;
    let mut entries = Vec::with_capacity(modules);
    let mut lib_at: Option<usize> = None;
    for index in 0..modules {
        let key_offset = r.offset();
        let key = r.read_str("kind")?;
        let (kind, payload_offset, payload) = if key == LIB_KEY {
            if let Some(first) = lib_at {
                return Err(FormatError::new(
                    key_offset,
                    FormatErrorKind::DuplicateLib { first: first as u64, second: index as u64 },
                ));
            }
            lib_at = Some(index);
            (EntryKind::Lib, r.offset(), &[][..])
        } else {
            let bytes = r.read_str_bytes("payload")?;
            (EntryKind::Module, r.offset() - bytes.len() as u64, bytes)
        };
        entries.push(Entry { type_key: key, kind, key_offset, payload_offset, payload });
    }
    r.finish("the last module")?;
    Ok((entries, Some(tree)))
}

fn lone_tree() -> ImportTree {
    ImportTree { row_ptr: vec![0, 0], child_indices: vec![] }
}

/// Bytes of the tvm-ffi body for these entries. Without a tree (a lone library) the body is a
/// one-module tree holding `_lib`.
pub(crate) fn body_len(entries: &[BlobEntry<'_>], tree: Option<&ImportTree>) -> io::Result<u64> {
    let lone = [BlobEntry::Lib];
    let (entries, tree_len) = match tree {
        Some(t) => (entries, t.encoded_len()),
        None => (&lone[..], lone_tree().encoded_len()),
    };
    let mut n = tree_len;
    for e in entries {
        n += match e {
            BlobEntry::Lib => stream::str_len(LIB_KEY.len() as u64),
            BlobEntry::Module(p) => {
                stream::str_len(p.entry_key().len() as u64) + stream::str_len(p.entry_len(Layout::Ffi)?)
            }
        };
    }
    Ok(n)
}

/// Writes the tvm-ffi body.
pub(crate) fn write_body(out: &mut dyn Write, entries: &[BlobEntry<'_>], tree: Option<&ImportTree>) -> io::Result<()> {
    let lone_entries = [BlobEntry::Lib];
    let lone = lone_tree();
    let (entries, tree) = match tree {
        Some(t) => (entries, t),
        None => (&lone_entries[..], &lone),
    };
    debug_assert!(tree.validate(entries.len()).is_ok());
    tree.write_to(out)?;
    for e in entries {
        match e {
            BlobEntry::Lib => stream::write_str(out, LIB_KEY)?,
            BlobEntry::Module(p) => {
                stream::write_str(out, p.entry_key())?;
                stream::write_u64(out, p.entry_len(Layout::Ffi)?)?;
                p.write_entry(Layout::Ffi, out)?;
            }
        }
    }
    Ok(())
}
