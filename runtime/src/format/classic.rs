//! The classic body (TVM 0.8 to 0.21; legacy TVM 0.6 read too).
//!
//! ```text
//! body   := count:u64  entry{count}
//! entry  := key:str payload
//!   key == "_lib"          -> no payload
//!   key == "_import_tree"  -> row_ptr:vec<u64>  child_indices:vec<u64>   (always last)
//!   otherwise              -> the module's SaveToBinary bytes, unframed
//! ```
//!
//! With an import tree, `count` is the number of modules plus one. Without one (legacy), the
//! entries are all imports of the library. Payloads carry no length, so the reader asks a
//! [`PayloadSizer`] how long each one is. A payload it cannot measure ([`Measure::Unmeasured`]:
//! a kind kept as raw bytes, or on request an unknown key) ends where the next entry starts
//! from which the rest of the body parses (the end search).

use std::cell::Cell;
use std::io::{self, Write};

use super::error::{FormatError, FormatErrorKind};
use super::stream::{self, Reader};
use super::{
    BlobEntry, Entry, EntryKind, ImportTree, Layout, Measure, PayloadSizer, UnknownKeys, IMPORT_TREE_KEY, LIB_KEY,
};

/// How many unmeasured payloads may be nested in one search, and how many candidate ends may be
/// tried in all: bounds the work an adversarial blob can cause.
const MAX_UNMEASURED_DEPTH: u32 = 32;
const MAX_UNMEASURED_TRIES: u32 = 4096;
/// Longest type key the end search accepts as the start of the next entry.
const MAX_KEY_LEN: u64 = 128;
/// Positions the end search may look at in one pass: this many per byte of the body, plus
/// [`SCAN_SLACK`]. Each try walks back over the later payloads, and failing tries nest, so `k`
/// unmeasured payloads in a row cost about `2^k / 8` positions per byte: 256 accepts the eleven of
/// 64 KiB that [`MAX_UNMEASURED_TRIES`] allowed before. Without a cap, a body whose candidate ends
/// all lie before a long tail had every try walk the whole tail again (5.6 s per MiB; now
/// 0.4 s).
const SCAN_PER_BYTE: u64 = 256;
const SCAN_SLACK: u64 = 1 << 16;

struct Ctx<'s> {
    layout: Layout,
    sizer: &'s dyn PayloadSizer,
    unknown: UnknownKeys,
    tries: Cell<u32>,
    /// Positions looked at by the end search in this pass, and the most it may look at.
    scanned: Cell<u64>,
    max_scan: u64,
    /// First pass of the end search: the next entry must start with a key the reader
    /// knows (`_lib`, `_import_tree`, a registered kind), and an unmeasured payload may not simply
    /// run to the end. Payloads hold many strings that look like keys (a VM executable's
    /// version, function names), so only if that fails is any plausible key accepted.
    strict: bool,
}

type Parsed<'a> = (Vec<Entry<'a>>, Option<ImportTree>);

/// Parses a classic body whose first byte lies at `base`.
pub fn parse_body<'a>(
    body: &'a [u8],
    base: u64,
    layout: Layout,
    sizer: &dyn PayloadSizer,
    unknown: UnknownKeys,
) -> Result<Parsed<'a>, FormatError> {
    let mut r = Reader::new(body, base);
    let count = r.read_count("count", 8)? as u64;
    let max_scan = (body.len() as u64).saturating_mul(SCAN_PER_BYTE).saturating_add(SCAN_SLACK);
    let mut ctx = Ctx { layout, sizer, unknown, tries: Cell::new(0), scanned: Cell::new(0), max_scan, strict: true };
    let mut entries = Vec::new();
    let tree = match parse_entries(&ctx, r.clone(), count, &mut entries, 0) {
        Err(FormatError { kind: FormatErrorKind::UnmeasuredEnd { .. }, .. }) => {
            ctx.strict = false;
            ctx.tries.set(0);
            ctx.scanned.set(0);
            entries.clear();
            parse_entries(&ctx, r, count, &mut entries, 0)?
        }
        other => other?,
    };
    let modules = entries.iter().filter(|e| e.kind != EntryKind::ImportTree).count();
    check_single_lib(&entries)?;
    if let Some((tree, at)) = &tree {
        tree.validate(modules).map_err(|k| FormatError::new(*at, k))?;
    }
    Ok((entries, tree.map(|(t, _)| t)))
}

fn check_single_lib(entries: &[Entry<'_>]) -> Result<(), FormatError> {
    let mut libs = entries
        .iter()
        .filter(|e| e.kind != EntryKind::ImportTree)
        .enumerate()
        .filter(|(_, e)| e.kind == EntryKind::Lib);
    if let (Some((first, _)), Some((second, e))) = (libs.next(), libs.next()) {
        return Err(FormatError::new(
            e.key_offset,
            FormatErrorKind::DuplicateLib { first: first as u64, second: second as u64 },
        ));
    }
    Ok(())
}

/// Parses `left` entries from `r` to the end of the body, appending to `out`. Returns the
/// import tree (with its offset) if one was read.
fn parse_entries<'a>(
    ctx: &Ctx<'_>,
    mut r: Reader<'a>,
    mut left: u64,
    out: &mut Vec<Entry<'a>>,
    depth: u32,
) -> Result<Option<(ImportTree, u64)>, FormatError> {
    let mut tree = None;
    while left > 0 {
        left -= 1;
        let key_offset = r.offset();
        let key = r.read_str("type_key")?;
        let payload_offset = r.offset();
        if tree.is_some() {
            return Err(FormatError::new(
                key_offset,
                FormatErrorKind::MisplacedImportTree { reason: "an entry follows it" },
            ));
        }
        let (kind, len) = match key {
            LIB_KEY => (EntryKind::Lib, 0),
            IMPORT_TREE_KEY => {
                let mut t = r.clone();
                let row_ptr = t.read_vec_u64("row_ptr")?;
                let child_indices = t.read_vec_u64("child_indices")?;
                tree = Some((ImportTree { row_ptr, child_indices }, payload_offset));
                (EntryKind::ImportTree, t.offset() - payload_offset)
            }
            _ => match ctx.sizer.measure(key, r.rest(), payload_offset, ctx.layout) {
                Some(Ok(Measure::Len(len))) => (EntryKind::Module, len),
                Some(Err(e)) => return Err(e),
                Some(Ok(Measure::Unmeasured)) => {
                    return parse_unmeasured(ctx, r, key, key_offset, left, out, depth);
                }
                None if ctx.unknown == UnknownKeys::KeepRaw => {
                    return parse_unmeasured(ctx, r, key, key_offset, left, out, depth);
                }
                None => {
                    return Err(FormatError::new(
                        key_offset,
                        FormatErrorKind::UnknownTypeKey { key: key.to_owned(), registered: ctx.sizer.known_keys() },
                    ))
                }
            },
        };
        let payload = r.read_bytes(len, "payload")?;
        out.push(Entry { type_key: key, kind, key_offset, payload_offset, payload });
    }
    r.finish("the last entry")?;
    Ok(tree)
}

/// An unmeasured payload starts at `r`: try each later position where an entry could start, from
/// the last, and keep the first from which the rest of the body parses exactly.
fn parse_unmeasured<'a>(
    ctx: &Ctx<'_>,
    r: Reader<'a>,
    key: &'a str,
    key_offset: u64,
    left: u64,
    out: &mut Vec<Entry<'a>>,
    depth: u32,
) -> Result<Option<(ImportTree, u64)>, FormatError> {
    let payload_offset = r.offset();
    let rest = r.rest();
    let fail = |reason| FormatError::new(key_offset, FormatErrorKind::UnmeasuredEnd { key: key.to_owned(), reason });
    if left == 0 {
        if ctx.strict {
            return Err(fail("it is the last entry"));
        }
        // The last entry (legacy blobs only): the payload runs to the end of the body.
        out.push(Entry { type_key: key, kind: EntryKind::Module, key_offset, payload_offset, payload: rest });
        return Ok(None);
    }
    if depth >= MAX_UNMEASURED_DEPTH {
        return Err(fail("too many unmeasured payloads in a row"));
    }
    // From the end backwards: the entries after an unmeasured payload are small (`_lib`, the
    // import tree), so the search touches only the blob's last pages and a large payload is
    // never read (loading stays zero-copy and flat in payload size). Payload bytes that look
    // like an entry are also less likely near the end of the body than inside the payload.
    for end in (0..rest.len()).rev() {
        let scanned = ctx.scanned.get() + 1;
        ctx.scanned.set(scanned);
        if scanned > ctx.max_scan {
            return Err(fail("the search for its end looked at too many positions"));
        }
        let Some(candidate) = rest.get(end..) else { break };
        match key_at(candidate) {
            Some(k) if !ctx.strict || k == LIB_KEY || k == IMPORT_TREE_KEY || ctx.sizer.is_known(k) => {}
            _ => continue,
        }
        let tries = ctx.tries.get() + 1;
        ctx.tries.set(tries);
        if tries > MAX_UNMEASURED_TRIES {
            return Err(fail("too many candidate ends"));
        }
        let mut tail = Vec::new();
        let next = Reader::new(candidate, payload_offset + end as u64);
        if let Ok(tree) = parse_entries(ctx, next, left, &mut tail, depth + 1) {
            let payload = rest.get(..end).unwrap_or_default();
            out.push(Entry { type_key: key, kind: EntryKind::Module, key_offset, payload_offset, payload });
            out.append(&mut tail);
            return Ok(tree);
        }
    }
    Err(fail("no later position starts a valid rest of the blob"))
}

/// The `str` at the start of `bytes` when it could be a type key: 1 to 128 bytes of letters,
/// digits, `_`, `.` or `-`.
fn key_at(bytes: &[u8]) -> Option<&str> {
    let mut r = Reader::new(bytes, 0);
    let len = r.read_u64("key").ok().filter(|&l| l > 0 && l <= MAX_KEY_LEN)?;
    let k = std::str::from_utf8(r.read_bytes(len, "key").ok()?).ok()?;
    super::detect::is_plausible_key(k).then_some(k)
}

/// Bytes of the classic body for these entries.
pub fn body_len(layout: Layout, entries: &[BlobEntry<'_>], tree: Option<&ImportTree>) -> io::Result<u64> {
    let mut n = 8;
    if let Some(tree) = tree {
        for e in entries {
            n += match e {
                BlobEntry::Lib => stream::str_len(LIB_KEY.len() as u64),
                BlobEntry::Module(p) => stream::str_len(p.entry_key().len() as u64) + p.entry_len(layout)?,
            };
        }
        n += stream::str_len(IMPORT_TREE_KEY.len() as u64) + tree.encoded_len();
    }
    Ok(n)
}

/// Writes the classic body. Without a tree (a lone library) the body is `count = 0`.
pub fn write_body(
    out: &mut dyn Write,
    layout: Layout,
    entries: &[BlobEntry<'_>],
    tree: Option<&ImportTree>,
) -> io::Result<()> {
    let Some(tree) = tree else {
        return stream::write_u64(out, 0);
    };
    debug_assert!(tree.validate(entries.len()).is_ok());
    stream::write_u64(out, entries.len() as u64 + 1)?;
    for e in entries {
        match e {
            BlobEntry::Lib => stream::write_str(out, LIB_KEY)?,
            BlobEntry::Module(p) => {
                stream::write_str(out, p.entry_key())?;
                p.write_entry(layout, out)?;
            }
        }
    }
    stream::write_str(out, IMPORT_TREE_KEY)?;
    tree.write_to(out)
}
