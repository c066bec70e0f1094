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

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Write};

use super::error::{FormatError, FormatErrorKind};
use super::stream::{self, Reader};
use super::{
    BlobEntry, Entry, EntryKind, ImportTree, Layout, Measure, PayloadSizer, UnknownKeys, IMPORT_TREE_KEY, LIB_KEY,
};

/// How many unmeasured payloads may be nested in one search: deeper, the whole parse is
/// refused (each level is a frame of the search's recursion).
const MAX_UNMEASURED_DEPTH: u32 = 32;
/// Longest type key the end search accepts as the start of the next entry.
const MAX_KEY_LEN: u64 = 128;
/// Work the end search may do for one body (both passes): [`POSITIONS_PER_BYTE`] positions
/// looked at per byte of the body (a few nanoseconds each) plus [`POSITIONS_SLACK`], and one
/// try per [`BYTES_PER_TRY`] bytes plus [`TRIES_SLACK`], a try being a candidate end tried or
/// an entry parsed on the way from one (a hundred nanoseconds or so, most of it looking up
/// what is known). Every result is kept (see [`Search`]), so a real blob needs about one
/// position per byte of what follows its first unmeasured payload and a few tries per entry;
/// the bounds refuse inputs built to make the search work, in time linear in the body.
const POSITIONS_PER_BYTE: u64 = 4;
const POSITIONS_SLACK: u64 = 1 << 16;
const BYTES_PER_TRY: u64 = 16;
const TRIES_SLACK: u64 = 1 << 12;

struct Ctx<'s, 'a> {
    layout: Layout,
    sizer: &'s dyn PayloadSizer,
    unknown: UnknownKeys,
    /// The whole body and the offset of its first byte.
    body: &'a [u8],
    base: u64,
    /// The end search's state for this pass.
    search: RefCell<Search>,
    /// First pass of the end search: the next entry must start with a key the reader
    /// knows (`_lib`, `_import_tree`, a registered kind), and an unmeasured payload may not simply
    /// run to the end. Payloads hold many strings that look like keys (a VM executable's
    /// version, function names), so only if that fails is any plausible key accepted.
    strict: bool,
}

type Parsed<'a> = (Vec<Entry<'a>>, Option<ImportTree>);

thread_local! {
    static LAST_SEARCH_WORK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The work of the end search (both passes) in the last classic body parsed on this thread:
/// positions looked at, and tries (candidate ends tried, entries parsed on the way). A measure
/// of the reader's work that does not depend on the machine, for tests that check it stays
/// linear in the input: at most `4 n + 64 Ki` positions and `n / 16 + 4 Ki` tries for a body
/// of `n` bytes.
pub fn last_search_work() -> (u64, u64) {
    LAST_SEARCH_WORK.with(|w| w.get())
}

/// Parses a classic body whose first byte lies at `base`.
pub(crate) fn parse_body<'a>(
    body: &'a [u8],
    base: u64,
    layout: Layout,
    sizer: &dyn PayloadSizer,
    unknown: UnknownKeys,
) -> Result<Parsed<'a>, FormatError> {
    LAST_SEARCH_WORK.with(|w| w.set((0, 0)));
    let mut r = Reader::new(body, base);
    let count = r.read_count("count", 8)? as u64;
    let mut ctx =
        Ctx { layout, sizer, unknown, body, base, search: RefCell::new(Search::new(body.len())), strict: true };
    let mut entries = Vec::new();
    let record = |ctx: &Ctx<'_, '_>| {
        let s = ctx.search.borrow();
        LAST_SEARCH_WORK.with(|w| w.set((s.positions, s.tries)));
    };
    let first = parse_entries(&ctx, r.clone(), count, &mut entries, 0);
    record(&ctx);
    let tree = match first {
        Err(FormatError { kind: FormatErrorKind::UnmeasuredEnd { .. }, .. }) => {
            // What the first pass learnt does not hold in the second (other candidates), but
            // the work it did counts against the same bounds.
            ctx.strict = false;
            let done = ctx.search.replace(Search::new(body.len()));
            ctx.search.borrow_mut().positions = done.positions;
            ctx.search.borrow_mut().tries = done.tries;
            entries.clear();
            let second = parse_entries(&ctx, r, count, &mut entries, 0);
            record(&ctx);
            second?
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
    ctx: &Ctx<'_, 'a>,
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
    ctx: &Ctx<'_, 'a>,
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
    // The payload ends at the last position from which the rest of the body parses.
    let start = usize::try_from(payload_offset - ctx.base).unwrap_or(usize::MAX);
    let found = search_end(ctx, start, left, depth);
    let end = match found {
        Ok(Some(end)) => end,
        Ok(None) => return Err(fail("no later position starts a valid rest of the blob")),
        Err(reason) => return Err(fail(reason)),
    };
    let mut tail = Vec::new();
    let candidate = ctx.body.get(end..).unwrap_or_default();
    let tree = parse_entries(ctx, Reader::new(candidate, ctx.base + end as u64), left, &mut tail, depth + 1)?;
    let payload = rest.get(..end - start).unwrap_or_default();
    out.push(Entry { type_key: key, kind: EntryKind::Module, key_offset, payload_offset, payload });
    out.append(&mut tail);
    Ok(tree)
}

/// What the end search knows, kept for one pass over the body, so that no question is worked
/// out twice: the candidate ends found so far (scanning down from the end of the body), where
/// each entry position leads, and for each number of entries still to come, how far down the
/// candidates have been tried and which one worked.
///
/// Whether the rest of the body parses from a position `p` with `n` entries to come depends on
/// `p` and `n` only, and the search keeps the last candidate for which it does: so for a given
/// `n` the answer is the same candidate whatever payload asks (when it lies after that payload's
/// start), and the candidates are tried for each `n` at most once, from the end down.
struct Search {
    /// Every position at or after `low` has been looked at; the candidates among them, from the
    /// end down.
    low: usize,
    candidates: Vec<usize>,
    /// Where parsing from an entry position leads (see [`Chain`]).
    chains: HashMap<usize, Chain, BuildHasherDefault<PositionHasher>>,
    /// For each number of entries to come: the next candidate index to try and the one found.
    by_count: HashMap<u64, (usize, Option<usize>), BuildHasherDefault<PositionHasher>>,
    /// Positions looked at and tries made, and the most allowed of each.
    positions: u64,
    max_positions: u64,
    tries: u64,
    max_tries: u64,
}

/// Where parsing entries from a position leads, without a choice to make: `entries` entries
/// parse, after which the body is at `after`; then either nothing more parses (`unmeasured`
/// is `None`: an error, the end of the body, or an import tree, after which nothing may
/// follow), or an unmeasured payload starts at `unmeasured`.
#[derive(Debug, Clone, Copy)]
struct Chain {
    entries: u64,
    after: usize,
    unmeasured: Option<usize>,
}

impl Search {
    fn new(body_len: usize) -> Search {
        let n = body_len as u64;
        Search {
            low: body_len,
            candidates: Vec::new(),
            chains: HashMap::default(),
            by_count: HashMap::default(),
            positions: 0,
            max_positions: n.saturating_mul(POSITIONS_PER_BYTE).saturating_add(POSITIONS_SLACK),
            tries: 0,
            max_tries: n / BYTES_PER_TRY + TRIES_SLACK,
        }
    }

    fn position(&mut self) -> Result<(), &'static str> {
        if self.positions >= self.max_positions {
            return Err("the search for its end looked at too many positions");
        }
        self.positions += 1;
        Ok(())
    }

    fn try_one(&mut self) -> Result<(), &'static str> {
        if self.tries >= self.max_tries {
            return Err("the search for its end tried too many candidate ends");
        }
        self.tries += 1;
        Ok(())
    }
}

/// A hasher for the search's integer keys (positions, counts): one multiplication, where the
/// standard SipHash took most of the search's time. The keys are positions in the input and
/// counts bounded by it.
#[derive(Default)]
struct PositionHasher(u64);

impl Hasher for PositionHasher {
    fn finish(&self) -> u64 {
        // The product's high half depends on every bit of the key; folded into the low bits
        // (which pick the bucket), keys that differ only high up (multiples of a power of
        // two) still spread.
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// The last position at or after `start` from which `left` entries parse to the end of the
/// body (`Ok(None)`: there is none), or why the search gave up.
fn search_end(ctx: &Ctx<'_, '_>, start: usize, left: u64, depth: u32) -> Result<Option<usize>, &'static str> {
    if depth >= MAX_UNMEASURED_DEPTH {
        return Err("too many unmeasured payloads in a row");
    }
    // The searches this one starts are for fewer entries: none touches this count's state,
    // which is read once and written back once.
    let (mut next, found) = *ctx.search.borrow_mut().by_count.entry(left).or_insert((0, None));
    if let Some(end) = found {
        return Ok((end >= start).then_some(end));
    }
    let result = loop {
        let Some(candidate) = candidate(ctx, next, start)? else { break None };
        next += 1;
        if rest_parses(ctx, candidate, left, depth)? {
            break Some(candidate);
        }
    };
    ctx.search.borrow_mut().by_count.insert(left, (next, result));
    Ok(result)
}

/// The `index`-th candidate end from the end of the body, when it lies at or after `start`
/// (looking at more positions as needed).
fn candidate(ctx: &Ctx<'_, '_>, index: usize, start: usize) -> Result<Option<usize>, &'static str> {
    let mut s = ctx.search.borrow_mut();
    while s.candidates.len() <= index {
        if s.low <= start {
            return Ok(None);
        }
        s.position()?;
        let at = s.low - 1;
        // A key starts with its length, 1 to 128, as 8 bytes little-endian: bytes 1 to 7 zero.
        let Some(word) = word_at(ctx.body, at) else {
            s.low = at;
            continue;
        };
        if (1..=MAX_KEY_LEN).contains(&word) {
            match ctx.body.get(at..).and_then(key_at) {
                Some(k) if !ctx.strict || k == LIB_KEY || k == IMPORT_TREE_KEY || ctx.sizer.is_known(k) => {
                    s.candidates.push(at)
                }
                _ => {}
            }
        }
        // Skip the positions that cannot start a key either: those whose bytes 1 to 7 hold
        // the lowest non-zero byte among this word's bytes 1 to 7 (random payload bytes: 7 at
        // a time), or, in a run of zeros, those whose first byte is zero (8 at a time).
        let high = word >> 8;
        s.low = if high != 0 {
            let j = (high.trailing_zeros() / 8 + 1) as usize;
            (at + j).saturating_sub(7).max(start).min(at)
        } else if word == 0 && at >= 8 && word_at(ctx.body, at - 8) == Some(0) {
            (at - 8).max(start)
        } else {
            at
        };
    }
    Ok(Some(s.candidates[index]).filter(|&c| c >= start))
}

/// The 8 bytes at `at`, little-endian.
fn word_at(body: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = body.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Whether `left` entries parse from `at` to exactly the end of the body.
fn rest_parses(ctx: &Ctx<'_, '_>, at: usize, left: u64, depth: u32) -> Result<bool, &'static str> {
    ctx.search.borrow_mut().try_one()?;
    let c = chain(ctx, at)?;
    if left <= c.entries {
        return Ok(left == c.entries && c.after == ctx.body.len());
    }
    let Some(payload) = c.unmeasured else { return Ok(false) };
    match left - c.entries - 1 {
        // The last entry: only a legacy blob's (the second pass) may run to the end.
        0 => Ok(!ctx.strict),
        more => Ok(search_end(ctx, payload, more, depth + 1)?.is_some()),
    }
}

/// Where parsing from the entry position `at` leads (kept for every position passed).
fn chain(ctx: &Ctx<'_, '_>, at: usize) -> Result<Chain, &'static str> {
    let mut passed = Vec::new();
    let mut pos = at;
    let mut end = loop {
        if let Some(&c) = ctx.search.borrow().chains.get(&pos) {
            break c;
        }
        ctx.search.borrow_mut().try_one()?;
        let stop = Chain { entries: 0, after: pos, unmeasured: None };
        let mut r = Reader::new(ctx.body.get(pos..).unwrap_or_default(), ctx.base + pos as u64);
        let Ok(key) = r.read_str("type_key") else { break stop };
        let payload_at = pos + (r.offset() - ctx.base - pos as u64) as usize;
        let len = match key {
            LIB_KEY => 0,
            IMPORT_TREE_KEY => {
                let mut t = r.clone();
                if t.read_vec_u64("row_ptr").is_err() || t.read_vec_u64("child_indices").is_err() {
                    break stop;
                }
                // Nothing may follow the import tree.
                let after = (t.offset() - ctx.base) as usize;
                let mut s = ctx.search.borrow_mut();
                s.positions = (s.positions + ((after - pos) / 8) as u64).min(s.max_positions);
                break Chain { entries: 1, after, unmeasured: None };
            }
            _ => match ctx.sizer.measure(key, r.rest(), r.offset(), ctx.layout) {
                Some(Ok(Measure::Len(len))) => len,
                Some(Ok(Measure::Unmeasured)) => break Chain { entries: 0, after: pos, unmeasured: Some(payload_at) },
                None if ctx.unknown == UnknownKeys::KeepRaw => {
                    break Chain { entries: 0, after: pos, unmeasured: Some(payload_at) }
                }
                _ => break stop,
            },
        };
        if r.read_bytes(len, "payload").is_err() {
            break stop;
        }
        passed.push(pos);
        pos = (r.offset() - ctx.base) as usize;
    };
    let mut s = ctx.search.borrow_mut();
    s.chains.insert(pos, end);
    for &p in passed.iter().rev() {
        end.entries += 1;
        s.chains.insert(p, end);
    }
    Ok(end)
}

/// The `str` at the start of `bytes` when it could be a type key: 1 to 128 bytes of letters,
/// digits, `_`, `.` or `-`.
fn key_at(bytes: &[u8]) -> Option<&str> {
    let mut r = Reader::new(bytes, 0);
    let len = r.read_u64("key").ok().filter(|&l| l > 0 && l <= MAX_KEY_LEN)?;
    let k = r.read_bytes(len, "key").ok()?;
    // Plausible key bytes are ASCII: the UTF-8 check cannot fail after this one.
    if !super::detect::is_plausible_key_bytes(k) {
        return None;
    }
    std::str::from_utf8(k).ok()
}

/// Bytes of the classic body for these entries.
pub(crate) fn body_len(layout: Layout, entries: &[BlobEntry<'_>], tree: Option<&ImportTree>) -> io::Result<u64> {
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
pub(crate) fn write_body(
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
